"""The gateway's upstream client against a tiny asyncio HTTP server on loopback: keep-alive
reuse, chunked bodies piece by piece, an idle connection the server closed, deadlines."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from kvtide.gateway.upstream import UpstreamClosed, UpstreamPool

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _serve(handler: Handler) -> tuple[asyncio.Server, str, list[int]]:
    """A server answering each request on a connection with ``handler``; the list counts
    the connections it accepted."""
    accepted: list[int] = []

    async def conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                await handler(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(conn, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}", accepted


async def _ok(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
    )
    await writer.drain()


def test_a_connection_is_reused_after_a_complete_response() -> None:
    async def run() -> list[int]:
        server, url, accepted = await _serve(_ok)
        pool = UpstreamPool(1.0, 1.0)
        for _ in range(5):
            resp = await pool.request(b"POST", url, "/v1/completions", b"{}")
            assert resp.status == 200 and resp.headers[b"content-type"] == b"application/json"
            assert await resp.read() == b"{}"
            resp.close()
        await pool.close()
        server.close()
        return accepted

    assert len(asyncio.run(run())) == 1


def test_a_chunked_stream_comes_piece_by_piece_as_sent() -> None:
    gate = asyncio.Event()

    async def stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(b"6\r\ndata 1\r\n")
        await writer.drain()
        await gate.wait()  # the second piece only once the first one was read
        writer.write(b"6\r\ndata 2\r\n0\r\n\r\n")
        await writer.drain()

    async def run() -> list[bytes]:
        server, url, _ = await _serve(stream)
        pool = UpstreamPool(1.0, 2.0)
        resp = await pool.request(b"POST", url, "/v1/completions", b"{}")
        pieces = [await resp.read_chunk()]
        gate.set()
        while piece := await resp.read_chunk():
            pieces.append(piece)
        resp.close()
        await pool.close()
        server.close()
        return pieces

    assert asyncio.run(run()) == [b"data 1", b"data 2"]


def test_an_idle_connection_the_server_closed_is_replaced() -> None:
    async def once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _ok(reader, writer)
        writer.close()  # no keep-alive header, but the server goes away after each answer

    async def run() -> list[int]:
        server, url, accepted = await _serve(once)
        pool = UpstreamPool(1.0, 1.0)
        for _ in range(3):
            resp = await pool.request(b"GET", url, "/health")
            assert await resp.read() == b"{}"
            resp.close()
            await asyncio.sleep(0.05)
        await pool.close()
        server.close()
        return accepted

    assert len(asyncio.run(run())) == 3


def test_no_answer_is_a_timeout_and_a_refused_connect_an_oserror() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(10)

    async def run() -> None:
        server, url, _ = await _serve(silent)
        pool = UpstreamPool(1.0, 0.2)
        with pytest.raises(TimeoutError):
            await pool.request(b"POST", url, "/v1/completions", b"{}")
        assert await pool.get(url, "/health", 0.2) is None
        server.close()
        with pytest.raises(OSError):
            await pool.request(b"POST", "http://127.0.0.1:1", "/v1/completions", b"{}")
        await pool.close()

    asyncio.run(run())


def test_a_connection_cut_mid_body_is_upstream_closed() -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
        await writer.drain()
        writer.close()

    async def run() -> None:
        server, url, _ = await _serve(cut)
        pool = UpstreamPool(1.0, 1.0)
        resp = await pool.request(b"POST", url, "/v1/completions", b"{}")
        assert await resp.read_chunk() == b"partial"
        with pytest.raises(UpstreamClosed):
            await resp.read_chunk()
        resp.close()
        await pool.close()
        server.close()

    asyncio.run(run())


def test_read_s_bounds_each_gap_between_pieces_not_the_whole_stream() -> None:
    """A stream of pieces each 0.05 s apart, 0.5 s in all, under a 0.2 s read deadline: it
    is read whole; then a gap of 0.4 s times out within the deadline's bounds."""
    gaps = [0.05] * 10 + [0.4]

    async def stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for gap in gaps:
            writer.write(b"1\r\nx\r\n")
            await writer.drain()
            await asyncio.sleep(gap)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def run() -> tuple[int, float]:
        server, url, _ = await _serve(stream)
        pool = UpstreamPool(1.0, 0.2)
        resp = await pool.request(b"POST", url, "/v1/completions", b"{}")
        loop = asyncio.get_running_loop()
        got = 0
        last = loop.time()
        with pytest.raises(TimeoutError):
            while await resp.read_chunk():
                got += 1
                last = loop.time()
        waited = loop.time() - last
        resp.close()
        await pool.close()
        server.close()
        return got, waited

    got, waited = asyncio.run(run())
    assert got == len(gaps)  # every piece before the long gap
    assert 0.2 - 0.01 <= waited <= 0.2 + 0.15  # the deadline, from the last piece


def test_a_reused_connection_keeps_a_shorter_deadline() -> None:
    """A connection whose previous request waited under a 5 s deadline, reused by a GET with
    a 0.2 s one that gets no answer: the GET times out at 0.2 s, not at the older timer."""
    answered = 0

    async def first_then_silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal answered
        answered += 1
        if answered == 1:
            await asyncio.sleep(0.05)  # the first request waits a little under its deadline
            await _ok(reader, writer)
        else:
            await asyncio.sleep(10)

    async def run() -> tuple[float, list[int]]:
        server, url, accepted = await _serve(first_then_silent)
        pool = UpstreamPool(1.0, 5.0)
        resp = await pool.request(b"POST", url, "/v1/completions", b"{}")
        assert await resp.read() == b"{}"
        resp.close()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(TimeoutError):
            await pool.request(b"GET", url, "/health", read_s=0.2)
        took = loop.time() - t0
        await pool.close()
        server.close()
        return took, accepted

    took, accepted = asyncio.run(run())
    assert len(accepted) == 1  # the same connection, reused
    assert took < 1.0
