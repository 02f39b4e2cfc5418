"""SPDY/3.1 framing: frame types, the zlib header-block codec and an incremental parser.

client-go's exec, attach and port-forward clients still speak SPDY/3.1 (through
moby/spdystream), so the streaming server must too. Facts from the SPDY/3 draft:

- every frame has an 8-byte header; a control frame starts with the C bit, version 3
  and a 16-bit type, a data frame with a 31-bit stream id; both then carry 8 bits of
  flags and a 24-bit length;
- name/value header blocks are 32-bit counts and lengths, names lowercase, several
  values of one name joined by NUL, the whole block zlib-compressed with a fixed
  dictionary, one compression context per direction for the connection's lifetime,
  each block ending in a sync flush so the peer can decode it on its own.

Pure code (no I/O), so the codec is tested byte for byte.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from pycri.streaming.limits import MAX_FRAME

VERSION = 3

# Control frame types.
SYN_STREAM = 1
SYN_REPLY = 2
RST_STREAM = 3
SETTINGS = 4
PING = 6
GOAWAY = 7
HEADERS = 8
WINDOW_UPDATE = 9

FLAG_FIN = 0x01
FLAG_UNIDIRECTIONAL = 0x02
FLAG_SETTINGS_CLEAR = 0x01

# RST_STREAM status codes.
PROTOCOL_ERROR = 1
INVALID_STREAM = 2
REFUSED_STREAM = 3
CANCEL = 5
INTERNAL_ERROR = 6

MAX_LENGTH = (1 << 24) - 1
# What we accept from a peer (the streaming server's frame bound, shared with WebSocket).
MAX_RECEIVE = MAX_FRAME
# A header block, inflated, and its number of names: client-go sends a handful of short
# headers; sessions keep every stream's headers, so these bound what one stream costs.
MAX_HEADER_BLOCK = 64 * 1024
MAX_HEADERS = 64
# Entries of one SETTINGS frame: SPDY/3 defines 8 settings; a frame claiming more only
# makes the parser build them.
MAX_SETTINGS = 32
_ID_MASK = 0x7FFFFFFF

Headers = dict[str, list[str]]


def _dictionary() -> bytes:
    """The SPDY/3 header dictionary: length-prefixed words, then a run of common text."""
    words = [
        "options", "head", "post", "put", "delete", "trace", "accept", "accept-charset",
        "accept-encoding", "accept-language", "accept-ranges", "age", "allow", "authorization",
        "cache-control", "connection", "content-base", "content-encoding", "content-language",
        "content-length", "content-location", "content-md5", "content-range", "content-type",
        "date", "etag", "expect", "expires", "from", "host", "if-match", "if-modified-since",
        "if-none-match", "if-range", "if-unmodified-since", "last-modified", "location",
        "max-forwards", "pragma", "proxy-authenticate", "proxy-authorization", "range",
        "referer", "retry-after", "server", "te", "trailer", "transfer-encoding", "upgrade",
        "user-agent", "vary", "via", "warning", "www-authenticate", "method", "get", "status",
        "200 OK", "version", "HTTP/1.1", "url", "public", "set-cookie", "keep-alive", "origin",
    ]
    tail = (
        "100101201202205206300302303304305306307402405406407408409410411412413414415416417"
        "502504505203 Non-Authoritative Information204 No Content301 Moved Permanently"
        "400 Bad Request401 Unauthorized403 Forbidden404 Not Found"
        "500 Internal Server Error501 Not Implemented503 Service Unavailable"
        "Jan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 "
        "Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMT"
        "chunked,text/html,image/png,image/jpg,image/gif,application/xml,"
        "application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age="
        "gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0."
    )
    out = bytearray()
    for word in words:
        out += struct.pack(">I", len(word)) + word.encode()
    return bytes(out + tail.encode())


DICTIONARY = _dictionary()


class SpdyError(Exception):
    """The peer sent something that is not valid SPDY/3.1; the session must end."""


@dataclass
class DataFrame:
    stream_id: int
    data: bytes = b""
    fin: bool = False


@dataclass
class SynStream:
    stream_id: int
    headers: Headers = field(default_factory=dict)
    associated_id: int = 0
    priority: int = 0
    fin: bool = False
    unidirectional: bool = False


@dataclass
class SynReply:
    stream_id: int
    headers: Headers = field(default_factory=dict)
    fin: bool = False


@dataclass
class RstStream:
    stream_id: int
    status: int = CANCEL


@dataclass
class Settings:
    entries: list[tuple[int, int, int]] = field(default_factory=list)  # (flags, id, value)
    clear: bool = False


@dataclass
class Ping:
    ping_id: int


@dataclass
class GoAway:
    last_good_stream_id: int = 0
    status: int = 0


@dataclass
class HeadersFrame:
    stream_id: int
    headers: Headers = field(default_factory=dict)
    fin: bool = False


@dataclass
class WindowUpdate:
    stream_id: int
    delta: int


@dataclass
class Unknown:
    """A control frame of a type SPDY/3 does not define: ignored, as the spec asks."""

    frame_type: int


Frame = (
    DataFrame | SynStream | SynReply | RstStream | Settings | Ping | GoAway | HeadersFrame
    | WindowUpdate | Unknown
)


def encode_header_block(headers: Headers) -> bytes:
    """The uncompressed name/value block; names are lowercased as SPDY requires."""
    out = bytearray(struct.pack(">I", len(headers)))
    for name, values in headers.items():
        n = name.lower().encode()
        v = b"\0".join(x.encode() for x in values)
        out += struct.pack(">I", len(n)) + n + struct.pack(">I", len(v)) + v
    return bytes(out)


def decode_header_block(block: bytes) -> Headers:
    """Parse an uncompressed block; it must be consumed exactly."""
    try:
        (count,) = struct.unpack_from(">I", block, 0)
        if count > MAX_HEADERS:
            raise SpdyError(f"header block with {count} names (limit {MAX_HEADERS})")
        pos = 4
        headers: Headers = {}
        for _ in range(count):
            (nlen,) = struct.unpack_from(">I", block, pos)
            name = block[pos + 4 : pos + 4 + nlen]
            pos += 4 + nlen
            (vlen,) = struct.unpack_from(">I", block, pos)
            value = block[pos + 4 : pos + 4 + vlen]
            pos += 4 + vlen
            if len(name) != nlen or len(value) != vlen or not name:
                raise SpdyError("truncated header block")
            key = name.decode("latin-1").lower()
            if key in headers:
                raise SpdyError(f"duplicate header {key!r}")
            headers[key] = value.decode("latin-1").split("\0")
    except struct.error:
        raise SpdyError("truncated header block") from None
    if pos != len(block):
        raise SpdyError("trailing bytes after the header block")
    return headers


class Codec:
    """One side of a SPDY connection: encodes what it sends, parses what it receives.

    Holds the two zlib contexts, so a connection uses exactly one Codec and encodes
    frames in the order it writes them.
    """

    def __init__(self) -> None:
        self._deflate = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, 15,
                                         zdict=DICTIONARY)  # fmt: skip
        self._inflate = zlib.decompressobj(zdict=DICTIONARY)
        self._buf = bytearray()

    # -- encoding -------------------------------------------------------------------

    def _compress(self, headers: Headers) -> bytes:
        raw = encode_header_block(headers)
        return self._deflate.compress(raw) + self._deflate.flush(zlib.Z_SYNC_FLUSH)

    def encode(self, frame: Frame) -> bytes:
        if isinstance(frame, DataFrame):
            return _data(frame.stream_id, FLAG_FIN if frame.fin else 0, frame.data)
        if isinstance(frame, SynStream):
            flags = (FLAG_FIN if frame.fin else 0) | (
                FLAG_UNIDIRECTIONAL if frame.unidirectional else 0)
            body = struct.pack(">IIBB", frame.stream_id & _ID_MASK,
                               frame.associated_id & _ID_MASK, (frame.priority & 7) << 5, 0)
            return _control(SYN_STREAM, flags, body + self._compress(frame.headers))
        if isinstance(frame, SynReply):
            body = struct.pack(">I", frame.stream_id & _ID_MASK)
            return _control(SYN_REPLY, FLAG_FIN if frame.fin else 0,
                            body + self._compress(frame.headers))
        if isinstance(frame, HeadersFrame):
            body = struct.pack(">I", frame.stream_id & _ID_MASK)
            return _control(HEADERS, FLAG_FIN if frame.fin else 0,
                            body + self._compress(frame.headers))
        if isinstance(frame, RstStream):
            return _control(RST_STREAM, 0, struct.pack(">II", frame.stream_id & _ID_MASK,
                                                       frame.status))
        if isinstance(frame, Settings):
            body = struct.pack(">I", len(frame.entries)) + b"".join(
                struct.pack(">II", (f << 24) | (i & 0xFFFFFF), v) for f, i, v in frame.entries)
            return _control(SETTINGS, FLAG_SETTINGS_CLEAR if frame.clear else 0, body)
        if isinstance(frame, Ping):
            return _control(PING, 0, struct.pack(">I", frame.ping_id))
        if isinstance(frame, GoAway):
            return _control(GOAWAY, 0, struct.pack(">II", frame.last_good_stream_id & _ID_MASK,
                                                   frame.status))
        if isinstance(frame, WindowUpdate):
            return _control(WINDOW_UPDATE, 0, struct.pack(">II", frame.stream_id & _ID_MASK,
                                                          frame.delta & _ID_MASK))
        raise TypeError(f"not a SPDY frame: {frame!r}")  # pragma: no cover

    # -- decoding -------------------------------------------------------------------

    def feed(self, data: bytes) -> list[Frame]:
        """Add received bytes; return every frame now complete."""
        self.receive(data)
        return list(self.frames())

    def receive(self, data: bytes) -> None:
        self._buf += data

    def frames(self) -> Iterator[Frame]:
        """The complete frames received so far, parsed one at a time as they are taken
        (a reader can yield between frames, and holds one frame, not a read's worth)."""
        while len(self._buf) >= 8:
            (length,) = struct.unpack(">I", b"\0" + self._buf[5:8])
            if length > MAX_RECEIVE:
                raise SpdyError(f"frame of {length} bytes (limit {MAX_RECEIVE})")
            if len(self._buf) < 8 + length:
                return
            head = bytes(self._buf[:8])
            body = bytes(self._buf[8 : 8 + length])
            del self._buf[: 8 + length]
            yield self._parse(head, body)

    def _headers(self, block: bytes) -> Headers:
        try:
            raw = self._inflate.decompress(block, MAX_HEADER_BLOCK)
        except zlib.error as e:
            raise SpdyError(f"header block does not decompress: {e}") from None
        if self._inflate.unconsumed_tail:
            raise SpdyError(f"header block inflates past {MAX_HEADER_BLOCK} bytes")
        return decode_header_block(raw)

    def _parse(self, head: bytes, body: bytes) -> Frame:
        flags = head[4]
        if not head[0] & 0x80:
            (sid,) = struct.unpack(">I", head[:4])
            return DataFrame(sid & _ID_MASK, body, bool(flags & FLAG_FIN))
        version, ftype = struct.unpack(">HH", head[:4])
        if version & 0x7FFF != VERSION:
            raise SpdyError(f"unsupported SPDY version {version & 0x7FFF}")
        try:
            if ftype == SYN_STREAM:
                sid, assoc, prio, _slot = struct.unpack_from(">IIBB", body)
                return SynStream(sid & _ID_MASK, self._headers(body[10:]), assoc & _ID_MASK,
                                 prio >> 5, bool(flags & FLAG_FIN),
                                 bool(flags & FLAG_UNIDIRECTIONAL))  # fmt: skip
            if ftype in (SYN_REPLY, HEADERS):
                (sid,) = struct.unpack_from(">I", body)
                cls = SynReply if ftype == SYN_REPLY else HeadersFrame
                return cls(sid & _ID_MASK, self._headers(body[4:]), bool(flags & FLAG_FIN))
            if ftype == RST_STREAM:
                sid, status = struct.unpack_from(">II", body)
                return RstStream(sid & _ID_MASK, status)
            if ftype == SETTINGS:
                (count,) = struct.unpack_from(">I", body)
                if count > MAX_SETTINGS:
                    raise SpdyError(f"SETTINGS with {count} entries (limit {MAX_SETTINGS})")
                entries = []
                for k in range(count):
                    fid, value = struct.unpack_from(">II", body, 4 + 8 * k)
                    entries.append((fid >> 24, fid & 0xFFFFFF, value))
                return Settings(entries, bool(flags & FLAG_SETTINGS_CLEAR))
            if ftype == PING:
                return Ping(struct.unpack_from(">I", body)[0])
            if ftype == GOAWAY:
                last, status = struct.unpack_from(">II", body) if len(body) >= 8 else (
                    struct.unpack_from(">I", body)[0], 0)
                return GoAway(last & _ID_MASK, status)
            if ftype == WINDOW_UPDATE:
                sid, delta = struct.unpack_from(">II", body)
                return WindowUpdate(sid & _ID_MASK, delta & _ID_MASK)
        except struct.error:
            raise SpdyError(f"control frame type {ftype} too short ({len(body)} bytes)") from None
        return Unknown(ftype)


def _control(ftype: int, flags: int, body: bytes) -> bytes:
    if len(body) > MAX_LENGTH:
        raise SpdyError("control frame too large")
    return struct.pack(">HHI", 0x8000 | VERSION, ftype, (flags << 24) | len(body)) + body


def _data(stream_id: int, flags: int, data: bytes) -> bytes:
    if len(data) > MAX_LENGTH:
        raise SpdyError("data frame too large")
    return struct.pack(">II", stream_id & _ID_MASK, (flags << 24) | len(data)) + data
