"""The netlink pieces sock_diag readers share (linux/netlink.h, linux/sock_diag.h)."""

import struct

NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY = 4, 20
NLM_F_REQUEST, NLM_F_DUMP, NLMSG_ERROR, NLMSG_DONE = 0x1, 0x300, 2, 3


def messages(data: bytes):
    """(type, sequence number, payload) of each netlink message in one datagram."""
    while len(data) >= 16:
        length, kind, _, seq = struct.unpack_from("=IHHI", data)
        if length < 16:
            return
        yield kind, seq, data[16:length]
        data = data[(length + 3) & ~3:]
