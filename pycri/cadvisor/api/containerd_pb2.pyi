import datetime

from google.protobuf import any_pb2 as _any_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TaskStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UNKNOWN: _ClassVar[TaskStatus]
    CREATED: _ClassVar[TaskStatus]
    RUNNING: _ClassVar[TaskStatus]
    STOPPED: _ClassVar[TaskStatus]
    PAUSED: _ClassVar[TaskStatus]
    PAUSING: _ClassVar[TaskStatus]
UNKNOWN: TaskStatus
CREATED: TaskStatus
RUNNING: TaskStatus
STOPPED: TaskStatus
PAUSED: TaskStatus
PAUSING: TaskStatus

class GetContainerRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class GetContainerResponse(_message.Message):
    __slots__ = ("container",)
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    container: Container
    def __init__(self, container: _Optional[_Union[Container, _Mapping]] = ...) -> None: ...

class Container(_message.Message):
    __slots__ = ("id", "labels", "image", "runtime", "spec", "snapshotter", "snapshot_key", "created_at", "updated_at", "sandbox")
    class Runtime(_message.Message):
        __slots__ = ("name", "options")
        NAME_FIELD_NUMBER: _ClassVar[int]
        OPTIONS_FIELD_NUMBER: _ClassVar[int]
        name: str
        options: _any_pb2.Any
        def __init__(self, name: _Optional[str] = ..., options: _Optional[_Union[_any_pb2.Any, _Mapping]] = ...) -> None: ...
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTTER_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_KEY_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_FIELD_NUMBER: _ClassVar[int]
    id: str
    labels: _containers.ScalarMap[str, str]
    image: str
    runtime: Container.Runtime
    spec: _any_pb2.Any
    snapshotter: str
    snapshot_key: str
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    sandbox: str
    def __init__(self, id: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., image: _Optional[str] = ..., runtime: _Optional[_Union[Container.Runtime, _Mapping]] = ..., spec: _Optional[_Union[_any_pb2.Any, _Mapping]] = ..., snapshotter: _Optional[str] = ..., snapshot_key: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., sandbox: _Optional[str] = ...) -> None: ...

class GetTaskRequest(_message.Message):
    __slots__ = ("container_id", "exec_id")
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    EXEC_ID_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    exec_id: str
    def __init__(self, container_id: _Optional[str] = ..., exec_id: _Optional[str] = ...) -> None: ...

class GetTaskResponse(_message.Message):
    __slots__ = ("process",)
    PROCESS_FIELD_NUMBER: _ClassVar[int]
    process: Process
    def __init__(self, process: _Optional[_Union[Process, _Mapping]] = ...) -> None: ...

class Process(_message.Message):
    __slots__ = ("container_id", "id", "pid", "status", "exit_status", "exited_at")
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    EXIT_STATUS_FIELD_NUMBER: _ClassVar[int]
    EXITED_AT_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    id: str
    pid: int
    status: TaskStatus
    exit_status: int
    exited_at: _timestamp_pb2.Timestamp
    def __init__(self, container_id: _Optional[str] = ..., id: _Optional[str] = ..., pid: _Optional[int] = ..., status: _Optional[_Union[TaskStatus, str]] = ..., exit_status: _Optional[int] = ..., exited_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class VersionResponse(_message.Message):
    __slots__ = ("version", "revision")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    version: str
    revision: str
    def __init__(self, version: _Optional[str] = ..., revision: _Optional[str] = ...) -> None: ...
