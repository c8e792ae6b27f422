/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sl_net: sockets.
 */
#ifndef SL_NET_H
#define SL_NET_H

#include <stddef.h>

/*
 * Open a non-blocking, close-on-exec listening TCP socket on addr
 * ("host:port" or "[v6]:port"), with SO_REUSEPORT when reuseport is set.
 * Returns the fd, or -1 with a message in err.
 */
int sl_net_listen(const char *addr, int reuseport, int backlog, char *err,
    size_t errlen);

/* Split "host:port" / "[v6]:port" into host and port (caller's buffers). */
int sl_net_split(const char *addr, char *host, size_t hlen, char *port,
    size_t plen);

/* Printable peer address of fd into buf ("127.0.0.1" or "::1"). */
void sl_net_peer(int fd, char *buf, size_t len);

#endif
