/* SPDX-License-Identifier: BSD-2-Clause */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "sl_net.h"

int
sl_net_split(const char *addr, char *host, size_t hlen, char *port, size_t plen)
{
	const char *colon, *hs = addr;
	size_t hl;

	if (addr[0] == '[') {
		const char *rb = strchr(addr, ']');

		if (rb == NULL || rb[1] != ':')
			return -1;
		hs = addr + 1;
		hl = (size_t)(rb - hs);
		colon = rb + 1;
	} else {
		colon = strrchr(addr, ':');
		if (colon == NULL)
			return -1;
		hl = (size_t)(colon - addr);
	}
	if (hl >= hlen || strlen(colon + 1) >= plen)
		return -1;
	memcpy(host, hs, hl);
	host[hl] = '\0';
	strcpy(port, colon + 1);
	return 0;
}

int
sl_net_listen(const char *addr, int reuseport, int backlog, char *err,
    size_t errlen)
{
	char host[256], port[16];
	struct addrinfo hints, *res = NULL, *ai;
	int fd = -1, one = 1, rc, saved = 0;

	if (sl_net_split(addr, host, sizeof(host), port, sizeof(port)) == -1) {
		snprintf(err, errlen, "%s: not host:port", addr);
		return -1;
	}
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
	rc = getaddrinfo(host[0] ? host : NULL, port, &hints, &res);
	if (rc != 0) {
		snprintf(err, errlen, "%s: %s", addr, gai_strerror(rc));
		return -1;
	}
	for (ai = res; ai != NULL; ai = ai->ai_next) {
		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK |
		    SOCK_CLOEXEC, ai->ai_protocol);
		if (fd == -1) {
			saved = errno;
			continue;
		}
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (reuseport &&
		    setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) == -1) {
			saved = errno;
			close(fd);
			fd = -1;
			continue;
		}
		if (ai->ai_family == AF_INET6)
			setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
		    listen(fd, backlog) == 0)
			break;
		saved = errno;
		close(fd);
		fd = -1;
	}
	freeaddrinfo(res);
	if (fd == -1)
		snprintf(err, errlen, "%s: %s", addr, strerror(saved));
	return fd;
}

void
sl_net_peer(int fd, char *buf, size_t len)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);

	buf[0] = '\0';
	if (getpeername(fd, (struct sockaddr *)&ss, &sl) == -1)
		return;
	if (ss.ss_family == AF_INET)
		inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, buf,
		    (socklen_t)len);
	else if (ss.ss_family == AF_INET6)
		inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, buf,
		    (socklen_t)len);
}
