/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sl_admin: the admin listener (GET /healthz, GET /metrics), served by the
 * master from its ppoll() loop. Tiny, non-blocking, one request per
 * connection, a capped number of connections at once (a new one evicts the
 * oldest silent one), a short deadline on each.
 */
#ifndef SL_ADMIN_H
#define SL_ADMIN_H

#include <poll.h>
#include <stddef.h>

/* A growable string for response bodies. */
struct sl_str {
	char *p;
	size_t len, cap;
};
void sl_str_printf(struct sl_str *, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Append n bytes of p (a label, a run of text): no format to parse. */
void sl_str_append(struct sl_str *, const char *p, size_t n);
void sl_str_free(struct sl_str *);

struct sl_admin_resp {
	int status;
	const char *content_type;
	struct sl_str body;
};

/* Fill resp for method/path; resp->status 0 means 404. */
typedef void (*sl_admin_handler)(void *arg, const char *method,
    const char *path, struct sl_admin_resp *resp);

struct sl_admin;

/* Listen on addr; NULL with a message in err on failure. */
struct sl_admin *sl_admin_open(const char *addr, char *err, size_t errlen);
void sl_admin_close(struct sl_admin *);

/*
 * Pollfds to wait on (at most max); returns how many were filled. An array
 * of SL_ADMIN_POLLFDS always has room for the listener and every
 * connection.
 */
#define SL_ADMIN_POLLFDS 257
int sl_admin_pollfds(struct sl_admin *, struct pollfd *, int max, double now);

/* Seconds until the earliest connection deadline, or -1 for none. */
double sl_admin_timeout(const struct sl_admin *, double now);

/* Handle readiness reported for the pollfds filled by sl_admin_pollfds. */
void sl_admin_service(struct sl_admin *, const struct pollfd *, int n,
    double now, sl_admin_handler, void *arg);

#endif
