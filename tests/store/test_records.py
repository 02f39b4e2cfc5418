"""store/records.py: the one store both managers keep their records in (written through
to SQLite; by ID, unique prefix, pod and reserved name, with a lock each), on real pod
and container records and a real database."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pycri.api import api_pb2 as pb
from pycri.errors import AlreadyExists, InvalidArgument, NotFound
from pycri.store import Store
from pycri.store.container import KIND as CONTAINER
from pycri.store.container import Container
from pycri.store.records import Records
from pycri.store.sandbox import KIND as SANDBOX
from pycri.store.sandbox import Sandbox


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Store]:
    store = Store(tmp_path / "pycri.db")
    yield store
    store.close()


def pod(sid: str = "") -> Sandbox:
    cfg = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name="p", namespace="n", uid="u"))
    return Sandbox(id=sid or secrets.token_hex(32), config=cfg, handler="runc",
                   runtime_handler="", created_at=time.time_ns())


def container(pod_id: str, cid: str = "") -> Container:
    return Container(id=cid or secrets.token_hex(32), sandbox_id=pod_id,
                     config=pb.ContainerConfig(metadata=pb.ContainerMetadata(name="c")),
                     image_id="sha256:" + "0" * 64, image_ref="busybox", handler="runc",
                     created_at=time.time_ns(), log_path="")


def containers(db: Store) -> Records[Container]:
    return Records("container", db, CONTAINER, lambda c: c.sandbox_id)


def test_saved_records_are_written_through_and_load_back(db: Store) -> None:
    records = containers(db)
    a, b = container("pod1"), container("pod2")
    records.save(a)
    records.save(a)
    records.save(b)
    assert a.revision == 2 and records[a.id] is a
    again = containers(db)
    for c in again.load(Container.from_record):
        again.put(c)
    assert sorted(again) == sorted([a.id, b.id])
    assert again[a.id].config == a.config and again.of_pod("pod2")[0].id == b.id
    records.forget(a)
    assert a.id not in records and records.of_pod("pod1") == []
    assert [c.id for c in containers(db).load(Container.from_record)] == [b.id]


def test_lookup_by_id_and_unique_prefix(db: Store) -> None:
    records = containers(db)
    a, b = container("p", "abc1" + "0" * 60), container("p", "abd2" + "0" * 60)
    records.put(a)
    records.put(b)
    assert records.lookup(a.id) is a and records[a.id] is a
    assert records.lookup("abc") is a and records.find("abd") is b
    with pytest.raises(InvalidArgument, match="ambiguous"):
        records.lookup("ab")
    with pytest.raises(NotFound, match="container 'ff' not found"):
        records.lookup("ff")
    with pytest.raises(NotFound):
        records.lookup("")
    assert records.find("ff") is None and records.get("abc") is None  # Mapping: exact only


def test_by_pod_follows_put_and_drop(db: Store) -> None:
    records = containers(db)
    p1, p2 = container("pod1"), container("pod1")
    other = container("pod2")
    for c in (p1, p2, other):
        records.put(c)
    assert {c.id for c in records.of_pod("pod1")} == {p1.id, p2.id}
    records.drop(p1)
    records.drop(p2)
    assert records.of_pod("pod1") == [] and "pod1" not in records._by_pod
    assert list(records) == [other.id] and len(records) == 1
    records.drop(p1)  # twice is nothing


def test_a_name_is_held_by_one_record_until_it_releases_it(db: Store) -> None:
    records: Records[Sandbox] = Records("pod sandbox", db, SANDBOX)
    records.reserve("p_n_u_0", "one")
    records.reserve("p_n_u_0", "one")  # the holder again: fine
    with pytest.raises(AlreadyExists, match="pod sandbox name 'p_n_u_0' is reserved for one"):
        records.reserve("p_n_u_0", "two")
    records.release("p_n_u_0", "two")  # a late release by another frees nothing
    with pytest.raises(AlreadyExists):
        records.reserve("p_n_u_0", "two")
    records.release("p_n_u_0", "one")
    records.reserve("p_n_u_0", "two")


def test_held_looks_the_record_up_again_once_the_lock_is_held(db: Store) -> None:
    """Ten removals queued on one lock: only the first finds the record."""
    records: Records[Sandbox] = Records("pod sandbox", db, SANDBOX)
    sb = pod()
    records.put(sb)
    found: list[Sandbox | None] = []

    async def remove() -> None:
        async with records.held(sb.id[:8]) as cur:
            found.append(cur)
            await asyncio.sleep(0)
            if cur is not None:
                records.drop(cur)

    async def main() -> None:
        await asyncio.gather(*(remove() for _ in range(10)))

    asyncio.run(main())
    assert found[0] is sb and found[1:] == [None] * 9
    assert records.find(sb.id) is None


def test_unlock_forgets_the_lock_of_a_record_gone_for_good(db: Store) -> None:
    records = containers(db)
    first = records.lock("x")
    assert records.lock("x") is first
    records.unlock("x")
    assert records.lock("x") is not first
