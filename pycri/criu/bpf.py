"""Is one chain of seccomp filters at least as strict as another, for every system call?

A restore gives the process the filters stored in the checkpoint (CRIU's seccomp.img),
not the ones its spec asks for, so creds.py compares the two here. A filter is a
classic-BPF program over `struct seccomp_data` (nr at 0, arch at 4, instruction pointer
at 8, six 64-bit arguments from 16, each read as two 32-bit words) that the kernel runs
on every system call; with several filters the strictest answer wins.

The comparison is exact, not sampled. Every program is walked path by path: a path is
a conjunction of conditions `(word & mask) OP k` on words of seccomp_data, and ends in an
action. Walking the wanted program first, then each filter of the checkpoint under the
conditions gathered so far (a branch whose conditions no input can meet is dropped), a
combination where the checkpoint answers more permissively than the wanted program is
a violation, with an input that shows it. Conditions on one word are decided exactly:
directly for plain comparisons, bit by bit (most significant first) where masks are
involved.

Only what seccomp filter generators emit is understood (absolute loads, AND with a
constant, constant jumps and returns); anything else, a program the kernel would not
load, or a comparison costing more than `MAX_WORK`, is an `Uncomparable` error, and the
caller refuses.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

MAX_INSNS = 4096  # BPF_MAXINSNS: the kernel loads no longer program
# Instructions walked plus conditions searched, over all paths of one comparison: runc's
# filter for the default profile against the profile costs 3-4.5 million (under 1 s).
MAX_WORK = 16_000_000
DATA_SIZE = 64  # sizeof(struct seccomp_data)
WORD = 0xFFFFFFFF

# Classic BPF opcodes seccomp programs use (linux/bpf_common.h).
LD_W_ABS, ALU_AND_K, JA, JEQ_K, JGT_K, JGE_K, JSET_K, RET_K = (
    0x20, 0x54, 0x05, 0x15, 0x25, 0x35, 0x45, 0x06)

# Return actions (linux/seccomp.h), by how strict the kernel takes them to be: of several
# filters' answers the one with the lowest signed action value wins.
KILL_PROCESS, KILL_THREAD, TRAP, ERRNO = 0x80000000, 0x00000000, 0x00030000, 0x00050000
USER_NOTIF, TRACE, LOG, ALLOW = 0x7FC00000, 0x7FF00000, 0x7FFC0000, 0x7FFF0000
ACTION_MASK = 0xFFFF0000
NAMES = {KILL_PROCESS: "KILL_PROCESS", KILL_THREAD: "KILL_THREAD", TRAP: "TRAP",
         ERRNO: "ERRNO", USER_NOTIF: "USER_NOTIF", TRACE: "TRACE", LOG: "LOG",
         ALLOW: "ALLOW"}
FIELDS = {0: "nr", 4: "arch", 8: "ip", 12: "ip.hi",
          **{16 + 8 * i: f"arg{i}" for i in range(6)},
          **{20 + 8 * i: f"arg{i}.hi" for i in range(6)}}


class Uncomparable(ValueError):
    """A program this module cannot decide about: the caller refuses the restore."""


@dataclass(frozen=True)
class Insn:
    code: int
    jt: int
    jf: int
    k: int


def decode(program: bytes) -> list[Insn]:
    """`struct sock_filter` array -> instructions, checked as the kernel checks them:
    1..4096 instructions, every jump forward and inside, loads inside seccomp_data."""
    if not program or len(program) % 8:
        raise Uncomparable(f"a filter of {len(program)} bytes is not a BPF program")
    n = len(program) // 8
    if n > MAX_INSNS:
        raise Uncomparable(f"a filter of {n} instructions is longer than the kernel loads")
    insns = [Insn(*struct.unpack_from("<HBBI", program, 8 * i)) for i in range(n)]
    for pc, i in enumerate(insns):
        if i.code == LD_W_ABS and (i.k % 4 or i.k >= DATA_SIZE):
            raise Uncomparable(f"instruction {pc} loads outside seccomp_data")
        if i.code == JA and pc + 1 + i.k >= n:
            raise Uncomparable(f"instruction {pc} jumps past the end")
        if i.code in (JEQ_K, JGT_K, JGE_K, JSET_K) and pc + 1 + max(i.jt, i.jf) >= n:
            raise Uncomparable(f"instruction {pc} jumps past the end")
        if i.code not in (LD_W_ABS, ALU_AND_K, JA, JEQ_K, JGT_K, JGE_K, JSET_K, RET_K):
            raise Uncomparable(f"instruction {pc} (opcode {i.code:#x}) is not one "
                               "seccomp filter generators emit")
    if insns[-1].code != RET_K:
        raise Uncomparable("the filter does not end in a return")
    return insns


_ORDER = (KILL_PROCESS, KILL_THREAD, TRAP, ERRNO, USER_NOTIF, TRACE, LOG, ALLOW)


def _signed(action: int) -> int:
    """The kernel's order of precedence: the lowest signed action value wins."""
    base = action & ACTION_MASK
    return base - (1 << 32) if base & 0x80000000 else base


def rank(action: int) -> int:
    """Higher is more permissive. An action the kernel does not know kills."""
    base = action & ACTION_MASK
    return _ORDER.index(base) if base in _ORDER else 0


def _ceiling(action: int) -> int:
    """The loosest rank a chain can still end in once one filter answered `action`:
    later filters only lower the winner (and an unknown winner kills)."""
    return max(i for i, a in enumerate(_ORDER) if _signed(a) <= _signed(action))


# -- conditions on one 32-bit word ----------------------------------------------------------

EQ, NE, GT, LE, GE, LT = "==", "!=", ">", "<=", ">=", "<"
_NEGATE = {EQ: NE, NE: EQ, GT: LE, LE: GT, GE: LT, LT: GE}
_ACCEPT = {EQ: (0,), NE: (-1, 1), GT: (1,), LE: (-1, 0), GE: (0, 1), LT: (-1,)}


@dataclass(frozen=True)
class Cond:
    """(word & mask) OP k."""

    mask: int
    op: str
    k: int


class Word:
    """The conditions on one word of seccomp_data, and a value meeting them all.

    Paths gather hundreds of conditions on nr (each syscall a path passes by is one), so
    a word keeps the value it last found: a new condition that value meets costs
    nothing, and only one it breaks starts a search."""

    __slots__ = ("_value", "conds", "fixed")

    def __init__(self, conds: tuple[Cond, ...] = (), value: int | None = None) -> None:
        self.conds = conds
        # The one value the word can have, where a plain equality pins it: then every
        # later condition on it is decided at once (nr and arch, on most paths).
        self.fixed = next((c.k for c in conds if c.op == EQ and c.mask == WORD), None)
        self._value = value

    def plus(self, c: Cond) -> Word:
        keep = self._value if self._value is not None and _holds(c, self._value) else None
        return Word((*self.conds, c), keep)

    def value(self, charge: Callable[[int], None] = lambda units: None) -> int | None:
        """A value meeting every condition, or None if there is none; a search charges
        its cost to `charge`."""
        if self._value is None:
            self._value = _solve(self.conds, charge)
        return self._value


def _solve(conds: tuple[Cond, ...], charge: Callable[[int], None]) -> int | None:
    """The least value meeting `conds`: plain comparisons bound it to a range less some
    values; conditions under a mask are searched bit by bit within that range, skipping
    the excluded values one by one."""
    charge(len(conds))
    lo, hi, out, masked = 0, WORD, set(), []
    for c in conds:
        if c.mask != WORD:
            masked.append(c)
        elif c.op == EQ:
            lo, hi = max(lo, c.k), min(hi, c.k)
        elif c.op == NE:
            out.add(c.k)
        elif c.op in (GT, GE):
            lo = max(lo, c.k + (c.op == GT))
        else:
            hi = min(hi, c.k - (c.op == LT))
    while lo <= hi:
        charge(1)
        v = _bitwise((*masked, Cond(WORD, GE, lo), Cond(WORD, LE, hi)), charge) if masked else lo
        if v is None or v not in out:
            return v
        lo = v + 1
    return None


def _bitwise(conds: tuple[Cond, ...], charge: Callable[[int], None]) -> int | None:
    """Exact search from the most significant bit. Each condition is in one of three
    states: its masked prefix equal to k's, above it, below it. A prefix is dropped as
    soon as a condition can no longer hold, given what the bits left can still make of it
    (so conditions on bits of their own never backtrack), and (bit, states) that failed
    once are not tried again; each node costs `charge`."""
    dead: set[tuple[int, tuple[int, ...]]] = set()

    def open_(c: Cond, bit: int) -> bool:
        """Can bits bit-1..0 still make a condition whose prefix is equal hold?"""
        low = (1 << bit) - 1
        m, k = c.mask & low, c.k & low
        return {EQ: not k & ~m, NE: bool(m | k), GT: m > k, GE: m >= k, LT: k > 0,
                LE: True}[c.op]

    def search(bit: int, states: tuple[int, ...], value: int) -> int | None:
        if bit < 0:
            return value
        if (bit, states) in dead:
            return None
        charge(2 * len(conds))
        for b in (0, 1):
            nxt = []
            for c, s in zip(conds, states, strict=True):
                if s == 0:
                    mine, theirs = b & (c.mask >> bit) & 1, (c.k >> bit) & 1
                    s = (mine > theirs) - (mine < theirs)
                    if (s not in _ACCEPT[c.op]) if s else not open_(c, bit):
                        break
                nxt.append(s)
            else:
                found = search(bit - 1, tuple(nxt), value | (b << bit))
                if found is not None:
                    return found
        dead.add((bit, states))
        return None

    if not all(open_(c, 32) for c in conds):
        return None
    return search(31, (0,) * len(conds), 0)


# -- walking programs -----------------------------------------------------------------------

Inputs = dict[int, Word]  # offset in seccomp_data -> its conditions


@dataclass
class _Walk:
    work: int = 0

    def charge(self, units: int) -> None:
        self.work += units
        if self.work > MAX_WORK:
            raise Uncomparable(f"comparing the filters takes more than {MAX_WORK} steps")

    def paths(self, prog: list[Insn], inputs: Inputs) -> list[tuple[int, Inputs]]:
        """Every (action, inputs narrowed to reach it) of `prog` some input can take."""
        out: list[tuple[int, Inputs]] = []
        # (pc, accumulator: constant value or (offset, mask), inputs)
        stack: list[tuple[int, int | tuple[int, int], Inputs]] = [(0, 0, inputs)]
        while stack:
            pc, acc, ins = stack.pop()
            while True:
                self.charge(1)
                i = prog[pc]
                if i.code == RET_K:
                    out.append((i.k, ins))
                    break
                if i.code == LD_W_ABS:
                    acc, pc = (i.k, WORD), pc + 1
                elif i.code == ALU_AND_K:
                    acc = acc & i.k if isinstance(acc, int) else (acc[0], acc[1] & i.k)
                    pc += 1
                elif i.code == JA:
                    pc += 1 + i.k
                else:
                    if isinstance(acc, tuple):
                        w = ins.get(acc[0])
                        if w is not None and w.fixed is not None:  # decided: no copy
                            jumps = _jumps(i, w.fixed & acc[1])
                            pc += 1 + (i.jt if jumps else i.jf)
                            continue
                    taken, other = _branch(i, acc)
                    nexts = []
                    for cond, target in ((taken, pc + 1 + i.jt), (other, pc + 1 + i.jf)):
                        narrowed = self.narrow(ins, acc, cond)
                        if narrowed is not None:
                            nexts.append((target, narrowed))
                    if not nexts:
                        break
                    for target, narrowed in nexts[1:]:
                        stack.append((target, acc, narrowed))
                    pc, ins = nexts[0]
        return out

    def narrow(self, ins: Inputs, acc: int | tuple[int, int], cond: Cond | bool
               ) -> Inputs | None:
        """`ins` with `cond` on the accumulator's word, or None if no input meets both."""
        if isinstance(cond, bool):
            return ins if cond else None
        assert isinstance(acc, tuple)
        word = ins.get(acc[0], Word()).plus(cond)
        if word.value(self.charge) is None:
            return None
        return {**ins, acc[0]: word}


def _branch(i: Insn, acc: int | tuple[int, int]) -> tuple[Cond | bool, Cond | bool]:
    """The conditions under which a conditional jump is taken and not taken."""
    if isinstance(acc, int):  # a constant: decided now
        jumps = _jumps(i, acc)
        return jumps, not jumps
    mask = acc[1]
    if i.code == JSET_K:
        c = Cond(mask & i.k, NE, 0)
    else:
        c = Cond(mask, {JEQ_K: EQ, JGT_K: GT, JGE_K: GE}[i.code], i.k)
    return c, Cond(c.mask, _NEGATE[c.op], c.k)


def _jumps(i: Insn, value: int) -> bool:
    """Whether conditional jump `i` is taken for an accumulator of `value`."""
    k = i.k
    return (value == k if i.code == JEQ_K else value > k if i.code == JGT_K
            else value >= k if i.code == JGE_K else bool(value & k))


def _holds(c: Cond, value: int) -> bool:
    v = value & c.mask
    return {EQ: v == c.k, NE: v != c.k, GT: v > c.k, LE: v <= c.k, GE: v >= c.k,
            LT: v < c.k}[c.op]


@dataclass(frozen=True)
class Violation:
    """An input where the checkpoint's filters answer more permissively than wanted."""

    inputs: dict[str, int]  # word name -> a value showing it
    got: int
    wanted: int

    def nr(self) -> int:
        return self.inputs.get("nr", 0)

    def arch(self) -> int:
        return self.inputs.get("arch", 0)


def looser(chain: list[bytes], wanted: bytes, limit: int = 8) -> list[Violation]:
    """Inputs (up to `limit`, one per system call and architecture) on which the chain of
    filters `chain` (as the kernel runs them: all, strictest answer wins) answers more
    permissively than the program `wanted`."""
    want = decode(wanted)
    progs = [decode(p) for p in chain]
    walk = _Walk()
    found: dict[tuple[int, int], Violation] = {}
    for action, ins in walk.paths(want, {}):
        for got, narrowed in _chain(walk, progs, ins, rank(action)):
            v = Violation({FIELDS[off]: w.value() or 0 for off, w in sorted(narrowed.items())},
                          got, action)
            found.setdefault((v.arch(), v.nr()), v)
            if len(found) >= limit:
                return list(found.values())
    return list(found.values())


def _chain(walk: _Walk, progs: list[list[Insn]], ins: Inputs, wanted: int
           ) -> list[tuple[int, Inputs]]:
    """(answer, inputs) of the chain under `ins` where the answer is looser than rank
    `wanted`; a branch is followed only while every filter so far answered more
    loosely (the strictest answer wins, so one strict enough answer ends it)."""
    if not progs:
        return []
    partial: list[tuple[int | None, Inputs]] = [(None, ins)]
    for prog in progs:
        nxt: list[tuple[int | None, Inputs]] = []
        for winner, narrowed in partial:
            for action, deeper in walk.paths(prog, narrowed):
                if winner is not None and _signed(winner) <= _signed(action):
                    action = winner
                if _ceiling(action) > wanted:
                    nxt.append((action, deeper))
        partial = nxt
    return [(w, narrowed) for w, narrowed in partial if w is not None and rank(w) > wanted]
