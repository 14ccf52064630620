"""How the server stops (issue 48): on SIGTERM or SIGINT every connection the kernel completed gets
an answer to each request sent on it, none is reset, and the process exits 0.

    1. The listening sockets stop taking connections, and nothing the kernel completed is lost: a
       socket filter makes the kernel drop every new SYN while the handshakes already answered
       complete (Linux; elsewhere the window is the few microseconds between emptying the queue
       and closing), asyncio stops accepting and lets the connections it accepted just before
       attach, HANDSHAKE_S later the connections in the accept queue are accepted, then the
       sockets close. A client that connects later is refused (ECONNREFUSED), never reset.
    2. A request the server began to handle before the signal is answered as usual; any other, on
       any open connection (one just taken from the accept queue, a keep-alive one, bytes already
       waiting in a socket), gets 503 {"error": "the server is stopping"}. Every answer from then on
       says Connection: close, and the connection closes after it: one answer, then nothing more.
    3. A connection that sends nothing stays open for the grace (--shutdown-grace), so that a request
       already on its way is refused with the 503 rather than met by a closed connection; after the
       grace it is closed. When no connection is left the server stops; at --shutdown-timeout what
       is still being answered is cut.

aiohttp's own shutdown (AppRunner.cleanup) closes the listener with its accept queue (the kernel
resets those connections), closes idle keep-alive connections at once, and ignores the bytes of a
request that arrives meanwhile (closing a socket with unread bytes is a reset): the losses of
issue 48. So the connections are drained here, and the runner's cleanup finds none.
"""
import asyncio
import collections
import ctypes
import errno
import os
import socket
import struct
import sys

from aiohttp import web

__all__ = ["STOPPING", "Stopping", "close_listeners", "drain"]

POLL_S = 0.02                   # how often the drain looks at the connections left
SO_ATTACH_FILTER = 26           # linux/asm-generic/socket.h
# Classic BPF over the TCP header (tcp_filter runs the listener's filter with the data at it):
# a segment with SYN set is dropped, any other kept whole. So no new handshake starts, while one the
# kernel already answered with SYN-ACK completes when its last ACK comes (dropping that ACK too, as
# an earlier drop-everything filter did, left the client connected and the server without the
# connection: a reset once the port closed, 1 run of the SIGTERM test in about 40).
DROP_SYN = struct.pack("HBBI" * 4,
                       0x30, 0, 0, 13,            # BPF_LD | BPF_B | BPF_ABS: the flags byte
                       0x45, 0, 1, 0x02,          # BPF_JMP | BPF_JSET | BPF_K: SYN set? drop : keep
                       0x06, 0, 0, 0,             # BPF_RET | BPF_K: keep 0 bytes (drop)
                       0x06, 0, 0, 0xFFFFFFFF)    # BPF_RET | BPF_K: keep it all
# How long an answered handshake is given to complete (its last ACK: one round trip) before the
# accept queue is emptied and the port closed; a client slower than that is reset.
HANDSHAKE_S = 0.25


class Stopping:
    """What the handlers and the drain share: since when the server stops (None: it serves), and
    the requests being handled on each connection (the others are idle)."""

    def __init__(self):
        self.since = None
        self.busy = collections.Counter()

    def enter(self, connection):
        self.busy[connection] += 1

    def leave(self, connection):
        self.busy[connection] -= 1
        if self.busy[connection] <= 0:
            del self.busy[connection]


STOPPING = web.AppKey("stopping", Stopping)


def _refuse_handshakes(listener):
    """From now on the kernel starts no handshake on `listener` (its SYNs are dropped: the client
    retries, then meets the closed port); those it already answered complete into the accept queue.
    Linux only; elsewhere nothing happens."""
    if not sys.platform.startswith("linux"):
        return
    program = (ctypes.c_uint8 * len(DROP_SYN)).from_buffer_copy(DROP_SYN)
    try:                        # struct sock_fprog {unsigned short len; struct sock_filter *filter}
        listener.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER,
                            struct.pack("HP", len(DROP_SYN) // 8, ctypes.addressof(program)))
    except OSError:
        pass


def _accept_queued(listener):
    """The connections in `listener`'s accept queue, each accepted (non-blocking: until it is empty)."""
    accepted = []
    while True:
        try:
            connection, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return accepted
        except ConnectionAbortedError:          # the client gave up before we took it
            continue
        except OSError as exc:                  # out of descriptors: the rest cannot be taken
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                print(f"stopping: {exc}; connections left in the accept queue are reset", file=sys.stderr)
                return accepted
            raise
        accepted.append(connection)


async def close_listeners(server, protocol_factory):
    """Step 1 on the asyncio Server `server`: [tasks making the connections taken from the accept
    queues `protocol_factory`'s]. No await between emptying the queues and closing the sockets.

    asyncio itself accepts in a callback and makes the connection in a task it starts then; that
    task attaches the transport to `server`, which fails once the server is closed (Server._attach
    asserts it is open), and the connection is dropped unanswered. So asyncio stops accepting first,
    and the tasks of what it accepted just before run up to their attach before anything closes."""
    loop = asyncio.get_running_loop()
    listeners = [socket.socket(fileno=os.dup(s.fileno())) for s in server.sockets]   # the same sockets
    accepted = []
    for listener in listeners:
        _refuse_handshakes(listener)
    for s in server.sockets:
        loop.remove_reader(s.fileno())      # its callback, even one already due, does not run again
    # the tasks it started run first (each is attached), and the handshakes answered before the
    # filter complete into the queue
    await asyncio.sleep(HANDSHAKE_S)
    for listener in listeners:
        listener.setblocking(False)
        accepted += _accept_queued(listener)
    server.close()
    for listener in listeners:              # the last descriptor of each: the port closes here
        listener.close()
    return [loop.create_task(loop.connect_accepted_socket(protocol_factory, connection))
            for connection in accepted]


async def drain(connections, stopping, grace, timeout):
    """Steps 2 and 3: wait until no connection is left (connections(): the open ones); idle ones
    are closed after `grace` seconds, every one after `timeout`. Returns how many busy connections
    were cut at the timeout."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    while True:
        await asyncio.sleep(POLL_S)     # first: connections accepted just before the signal register
        left = connections()
        if not left:
            return 0
        waited = loop.time() - began
        if waited >= timeout:
            cut = sum(1 for connection in left if connection in stopping.busy)
            for connection in left:
                connection.force_close()
            return cut
        if waited >= grace:
            for connection in left:
                if _idle(connection, stopping):
                    connection.force_close()


def _idle(connection, stopping):
    """No request being handled on `connection` (the handlers enter and leave Stopping), and nothing
    of an answer left to send (it may still be written after its handler returned)."""
    transport = connection.transport
    return connection not in stopping.busy and (transport is None or transport.get_write_buffer_size() == 0)
