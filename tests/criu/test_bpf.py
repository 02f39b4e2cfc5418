"""pycri/criu/bpf.py: is a chain of seccomp filters at least as strict as a wanted one.

Checked three ways: against brute force (generated programs whose constants are below 16,
so inputs 0..31 of each word they read cover every case), on programs libseccomp compiles
from real profiles, and on programs the kernel would not load or that cost too much."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pycri.criu import bpf, libseccomp
from pycri.oci import seccomp as profiles

LD, AND, JA, JEQ, JGT, JGE, JSET, RET = 0x20, 0x54, 0x05, 0x15, 0x25, 0x35, 0x45, 0x06
ACTIONS = [bpf.ALLOW, bpf.ERRNO | 1, bpf.ERRNO | 38, bpf.KILL_PROCESS, bpf.KILL_THREAD,
           bpf.TRAP, bpf.LOG, bpf.TRACE, bpf.USER_NOTIF, 0x7FFE0000]  # the last: unknown
NR, ARG0 = 0, 16


def insn(code: int, k: int = 0, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def ret(action: int) -> bytes:
    return insn(RET, action)


def run(program: bytes, data: dict[int, int]) -> int:
    """The kernel's answer for one input: a plain interpreter, independent of bpf.py."""
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = struct.unpack_from("<HBBI", program, 8 * pc)
        if code == RET:
            return k
        if code == LD:
            acc, pc = data.get(k, 0), pc + 1
        elif code == AND:
            acc, pc = acc & k, pc + 1
        elif code == JA:
            pc += 1 + k
        else:
            holds = {JEQ: acc == k, JGT: acc > k, JGE: acc >= k, JSET: bool(acc & k)}[code]
            pc += 1 + (jt if holds else jf)


def chain_answer(chain: list[bytes], data: dict[int, int]) -> int:
    return min((run(p, data) for p in chain), key=lambda a: bpf._signed(a))


@st.composite
def programs(draw: st.DrawFn) -> bytes:
    """Programs over nr and arg0 with constants and masks below 16 (or full masks)."""
    n = draw(st.integers(1, 14))
    out = []
    for pc in range(n):
        left = n - pc - 1  # instructions after this one, the final return included
        kind = draw(st.sampled_from(["ld", "and", "jmp", "jmp", "ret"]))
        if kind == "ld":
            out.append(insn(LD, draw(st.sampled_from([NR, ARG0]))))
        elif kind == "and":
            out.append(insn(AND, draw(st.integers(0, 15))))
        elif kind == "jmp":
            code = draw(st.sampled_from([JEQ, JGT, JGE, JSET]))
            out.append(insn(code, draw(st.integers(0, 15)), draw(st.integers(0, left)),
                            draw(st.integers(0, left))))
        else:
            out.append(ret(draw(st.sampled_from(ACTIONS))))
    return b"".join(out) + ret(draw(st.sampled_from(ACTIONS)))


INPUTS = [{NR: nr, ARG0: a} for nr in range(32) for a in range(32)]


@settings(max_examples=300, deadline=None)
@given(st.lists(programs(), min_size=1, max_size=3), programs())
def test_agrees_with_brute_force(chain: list[bytes], wanted: bytes) -> None:
    expected = [d for d in INPUTS
                if bpf.rank(chain_answer(chain, d)) > bpf.rank(run(wanted, d))]
    found = bpf.looser(chain, wanted, limit=1000)
    assert bool(found) == bool(expected), (expected[:3], found[:3])
    for v in found:  # each one shown is one
        d = {NR: v.inputs.get("nr", 0), ARG0: v.inputs.get("arg0", 0)}
        assert bpf.rank(chain_answer(chain, d)) > bpf.rank(run(wanted, d)), (v, d)
        assert chain_answer(chain, d) & bpf.ACTION_MASK == v.got & bpf.ACTION_MASK


def test_the_strictest_answer_of_a_chain_wins() -> None:
    allow_all, kill_all = ret(bpf.ALLOW), ret(bpf.KILL_PROCESS)
    errno_all = ret(bpf.ERRNO | 1)
    assert bpf.looser([allow_all], errno_all)
    assert not bpf.looser([allow_all, kill_all], errno_all)
    assert not bpf.looser([errno_all], ret(bpf.ERRNO | 38))  # another errno: as strict
    # an action the kernel does not know kills, unless a known one is lower: LOG is
    assert not bpf.looser([ret(0x7FFE0000)], errno_all)
    [v] = bpf.looser([ret(0x7FFE0000), ret(bpf.LOG)], errno_all)
    assert v.got == bpf.LOG


def test_conditions_on_one_word_are_decided_exactly() -> None:
    """Allow arg0 in 100..200 with bit 0x1000 set: no such value, so nothing is looser;
    with the range up to 0x2000 there is, and the input found shows it."""
    def allow_when(hi: int) -> bytes:
        return b"".join([insn(LD, ARG0), insn(JGT, 100, 0, 4), insn(JGE, hi, 3, 0),
                         insn(JSET, 0x1000, 0, 2), ret(bpf.ALLOW), ret(bpf.ALLOW),
                         ret(bpf.ERRNO | 1)])
    errno_all = ret(bpf.ERRNO | 1)
    assert not bpf.looser([allow_when(200)], errno_all)
    [v] = bpf.looser([allow_when(0x2000)], errno_all)
    assert v.inputs["arg0"] == 0x1000
    # masked equality, as libseccomp compiles SCMP_CMP_MASKED_EQ
    masked = b"".join([insn(LD, ARG0), insn(AND, 0xF0), insn(JEQ, 0x30, 0, 1),
                       ret(bpf.ALLOW), ret(bpf.ERRNO | 1)])
    [v] = bpf.looser([masked], errno_all)
    assert v.inputs["arg0"] & 0xF0 == 0x30


def compiled(**profile: object) -> bytes:
    return libseccomp.compile_profile(profile)


def test_real_profiles_compiled_by_libseccomp() -> None:
    default = profiles.for_capabilities(profiles.default_profile(), [])  # as a pod gets it
    wanted = compiled(**default)
    assert bpf.looser([wanted], wanted) == []
    # one syscall more than the profile allows: that syscall, on every architecture
    looser = {**default, "syscalls": [*default["syscalls"],
                                      {"names": ["unshare"], "action": "SCMP_ACT_ALLOW"}]}
    found = bpf.looser([compiled(**looser)], wanted, limit=50)
    assert {libseccomp.syscall_name(v.arch(), v.nr()) for v in found} == {
        "unshare", "unshare (x32)"}
    # allowing everything: the syscalls the profile answers by a rule of its own (one
    # for some arguments only, shown with arguments it refuses), and one input for all
    # those it answers by its default
    found = bpf.looser([compiled(defaultAction="SCMP_ACT_ALLOW",
                                 architectures=default["architectures"])], wanted, limit=500)
    by_name = {libseccomp.syscall_name(v.arch(), v.nr()): v for v in found
               if v.arch() == 0xC000003E}
    assert {"personality", "socket", "clone", "clone3"} < set(by_name), sorted(by_name)
    assert by_name["socket"].inputs["arg0"] == 40  # AF_VSOCK, which the profile refuses
    # stricter than wanted is fine
    assert bpf.looser([compiled(defaultAction="SCMP_ACT_KILL_PROCESS")], wanted) == []


@pytest.mark.parametrize(("program", "message"), [
    (b"", "0 bytes is not a BPF program"),
    (b"\x06\x00\x00\x00\x00\x00", "6 bytes"),
    (ret(0) * 4097, "longer than the kernel loads"),
    (insn(LD, 64) + ret(0), "loads outside seccomp_data"),
    (insn(LD, 2) + ret(0), "loads outside seccomp_data"),
    (insn(JA, 1) + ret(0), "jumps past the end"),
    (insn(JEQ, 0, 1, 0) + ret(0), "jumps past the end"),
    (insn(0x07) + ret(0), "opcode 0x7"),  # TAX
    (insn(0x16) + ret(0), "opcode 0x16"),  # RET A
    (insn(LD, 0), "does not end in a return"),
])
def test_what_the_kernel_would_not_load_is_uncomparable(program: bytes, message: str) -> None:
    with pytest.raises(bpf.Uncomparable, match=message):
        bpf.looser([program], ret(bpf.ALLOW))
    with pytest.raises(bpf.Uncomparable, match=message):
        bpf.looser([ret(bpf.ALLOW)], program)


def test_a_program_of_too_many_paths_is_uncomparable_in_bounded_time() -> None:
    """40 independent bit tests: 2^40 paths. The walk stops at MAX_WORK (about 5 s of
    one core at worst)."""
    diamond = b"".join(insn(LD, ARG0) + insn(JSET, 1 << (i % 32)) for i in range(40))
    with pytest.raises(bpf.Uncomparable, match="takes more than"):
        bpf.looser([diamond + ret(bpf.ALLOW)], ret(bpf.KILL_PROCESS))
