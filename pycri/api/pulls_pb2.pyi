from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListPullsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListPullsResponse(_message.Message):
    __slots__ = ("pulls",)
    PULLS_FIELD_NUMBER: _ClassVar[int]
    pulls: _containers.RepeatedCompositeFieldContainer[Pull]
    def __init__(self, pulls: _Optional[_Iterable[_Union[Pull, _Mapping]]] = ...) -> None: ...

class Pull(_message.Message):
    __slots__ = ("reference", "phase", "started_ns", "seconds", "clients", "layers")
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    STARTED_NS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    CLIENTS_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    reference: str
    phase: str
    started_ns: int
    seconds: float
    clients: int
    layers: _containers.RepeatedCompositeFieldContainer[Layer]
    def __init__(self, reference: _Optional[str] = ..., phase: _Optional[str] = ..., started_ns: _Optional[int] = ..., seconds: _Optional[float] = ..., clients: _Optional[int] = ..., layers: _Optional[_Iterable[_Union[Layer, _Mapping]]] = ...) -> None: ...

class Layer(_message.Message):
    __slots__ = ("digest", "size", "fetched", "unpacked", "bytes_per_second", "eta_seconds", "endpoint", "done")
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    FETCHED_FIELD_NUMBER: _ClassVar[int]
    UNPACKED_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    ETA_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    digest: str
    size: int
    fetched: int
    unpacked: int
    bytes_per_second: float
    eta_seconds: float
    endpoint: str
    done: bool
    def __init__(self, digest: _Optional[str] = ..., size: _Optional[int] = ..., fetched: _Optional[int] = ..., unpacked: _Optional[int] = ..., bytes_per_second: _Optional[float] = ..., eta_seconds: _Optional[float] = ..., endpoint: _Optional[str] = ..., done: _Optional[bool] = ...) -> None: ...
