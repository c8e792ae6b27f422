/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * One Redis connection's life, the same for a worker and the master
 * (cluster_int.h): the connect, the greeting, the loss, the backoff and
 * the error accounting. It knows neither side: it tells its owner through
 * the hooks.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/adapters/libev.h>

#include "cluster_int.h"

const char *const cl_err_names[ERR_MAX] = {
	"connect", "timeout", "reply", "fenced"
};

const double cl_rtt_bounds[RTT_BUCKETS] = {
	0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
	0.1, 0.25, 0.5, 1.0
};

/* ---- error accounting ------------------------------------------------- */

void
cl_row_err(struct sl_cluster_shm *cs, size_t row, enum cl_err e)
{
	if (cs == NULL)
		return;   /* a sentinel's connection: not Redis's errors */
	atomic_store_explicit(&cs->row[row].errors[e],
	    atomic_load_explicit(&cs->row[row].errors[e], memory_order_relaxed) + 1,
	    memory_order_relaxed);
}

void
cl_row_rtt(struct sl_cluster_shm *cs, size_t row, double s)
{
	struct row *r = &cs->row[row];
	int b;

	for (b = 0; b < RTT_BUCKETS && s > cl_rtt_bounds[b]; b++)
		;
	atomic_store_explicit(&r->rtt[b],
	    atomic_load_explicit(&r->rtt[b], memory_order_relaxed) + 1,
	    memory_order_relaxed);
	atomic_store_explicit(&r->rtt_sum_ns,
	    atomic_load_explicit(&r->rtt_sum_ns, memory_order_relaxed) +
	    (uint64_t)(s * 1e9), memory_order_relaxed);
}

int
cl_reply_is_error(const redisReply *r)
{
	return r == NULL || r->type == REDIS_REPLY_ERROR;
}

int
cl_reply_not_master(const redisReply *r)
{
	return r != NULL && r->type == REDIS_REPLY_ERROR && r->str != NULL &&
	    (strncmp(r->str, "READONLY", 8) == 0 ||
	    strncmp(r->str, "LOADING", 7) == 0);
}

/*
 * Redis refusing the same way at every reconnect or heartbeat (a password
 * missing or wrong) is logged once, then at most once a minute per process
 * with how many refusals went unlogged; the error counters count each one.
 * The line says what to fix where the reply tells it.
 */
static struct {
	char msg[128];
	double t;
	unsigned long more;
} refusal;

void
cl_log_refusal(enum sl_log_level level, const char *what, const char *str)
{
	double now = ev_time();
	char msg[128];
	const char *hint = "";
	int same;

	snprintf(msg, sizeof(msg), "%s: %s", what, str != NULL ? str : "(no reply)");
	same = strcmp(msg, refusal.msg) == 0;
	if (same && now - refusal.t < REFUSAL_QUIET) {
		refusal.more++;
		return;
	}
	if (str != NULL && strncmp(str, "NOAUTH", 6) == 0)
		hint = " (Redis wants a password: set cluster.password)";
	else if (str != NULL && (strncmp(str, "WRONGPASS", 9) == 0 ||
	    strstr(str, "invalid password") != NULL))
		hint = " (check cluster.password)";
	if (same && refusal.more > 0)
		sl_log(level, "cluster: %s%s; %lu more in the last %.0f s", msg, hint,
		    refusal.more, now - refusal.t);
	else
		sl_log(level, "cluster: %s%s", msg, hint);
	memcpy(refusal.msg, msg, sizeof(msg));
	refusal.t = now;
	refusal.more = 0;
}

void
cl_redis_count_cb(redisAsyncContext *ac, void *r, void *priv)
{
	struct cl_redis *rd = priv;

	(void)ac;
	if (r != NULL && cl_reply_is_error(r))
		cl_row_err(rd->cs, rd->row, ERR_REPLY);
	/* A release or a removal met a replica: the master asks again. */
	if (rd->check_role && rd->cs != NULL && cl_reply_not_master(r))
		atomic_store(&rd->cs->reask, 1);
}

/* ---- the connection --------------------------------------------------- */

static void
addr_parse(const char *s, struct cl_addr *a)
{
	const char *colon = strrchr(s, ':');
	size_t n;

	memset(a, 0, sizeof(*a));
	if (strncmp(s, "unix:", 5) == 0) {
		a->path = s + 5;
		return;
	}
	if (colon == NULL)
		return;
	a->port = atoi(colon + 1);
	if (s[0] == '[') {
		s++;
		n = (size_t)(colon - s) - 1;
	} else
		n = (size_t)(colon - s);
	if (n >= sizeof(a->host))
		n = sizeof(a->host) - 1;
	memcpy(a->host, s, n);
	a->host[n] = '\0';
}

/*
 * A new async connection to a, or NULL (a failed context is freed here, so
 * no callback of it ever runs). The connect itself completes later.
 */
static redisAsyncContext *
async_open(const struct cl_addr *a)
{
	redisAsyncContext *ac;

	if (a->path != NULL)
		ac = redisAsyncConnectUnix(a->path);
	else
		ac = redisAsyncConnect(a->host, a->port);
	if (ac != NULL && ac->err) {
		redisAsyncFree(ac);
		ac = NULL;
	}
	return ac;
}

void
cl_redis_init(struct cl_redis *rd, const char *redis, const char *password,
    struct sl_cluster_shm *cs, size_t row, struct ev_loop *loop, int greet,
    const struct cl_redis_hooks *hooks, void *owner)
{
	memset(rd, 0, sizeof(*rd));
	addr_parse(redis, &rd->addr);
	rd->password = password;
	rd->cs = cs;
	rd->row = row;
	rd->loop = loop;
	rd->greet = greet;
	rd->hooks = hooks;
	rd->owner = owner;
	rd->backoff = BACKOFF_MIN;
}

/* The context is gone already (ac NULL), or is freed here: tell the owner. */
static void
drop_as(struct cl_redis *rd, enum cl_gone how, const char *why)
{
	redisAsyncContext *ac = rd->ac;

	if (ac == NULL)
		return;
	rd->ac = NULL;
	rd->connected = 0;
	redisAsyncFree(ac);
	rd->hooks->gone(rd, how, why);
}

void
cl_redis_drop(struct cl_redis *rd, const char *why)
{
	drop_as(rd, CL_GONE_DROPPED, why);
}

void
cl_redis_close(struct cl_redis *rd)
{
	redisAsyncContext *ac = rd->ac;

	if (ac == NULL)
		return;
	/* What is still queued (releases, the node's ZREM) goes out first. */
	if (rd->connected)
		redisAsyncHandleWrite(ac);
	rd->ac = NULL;
	redisAsyncFree(ac);
}

static void
on_connect(const redisAsyncContext *ac, int status)
{
	struct cl_redis *rd = ac->data;

	if (rd == NULL || ac != rd->ac)
		return;
	if (status != REDIS_OK) {
		cl_row_err(rd->cs, rd->row, ERR_CONNECT);
		rd->ac = NULL;   /* hiredis frees it */
		rd->connected = 0;
		rd->hooks->gone(rd, CL_GONE_FAILED, ac->errstr);
		return;
	}
	rd->connected = 1;
	/*
	 * The backoff is reset by the first answer, not here: a Redis that
	 * accepts the connection and then refuses AUTH would otherwise be
	 * reconnected to ten times a second.
	 */
	rd->hooks->up(rd);
}

static void
on_disconnect(const redisAsyncContext *ac, int status)
{
	struct cl_redis *rd = ac->data;

	if (rd == NULL || ac != rd->ac)
		return;
	rd->ac = NULL;
	rd->connected = 0;
	if (status != REDIS_OK)
		cl_row_err(rd->cs, rd->row, ERR_CONNECT);
	rd->hooks->gone(rd, CL_GONE_LOST,
	    status != REDIS_OK ? ac->errstr : NULL);
}

/* The answer to the first command of a connection: AUTH, or PING. */
static void
greet_cb(redisAsyncContext *ac, void *r, void *priv)
{
	struct cl_redis *rd = priv;
	redisReply *reply = r;

	if (reply == NULL || ac != rd->ac)
		return;
	if (reply->type == REDIS_REPLY_ERROR && rd->cs == NULL) {
		/* A sentinel's: its owner logs it, naming its own password. */
		drop_as(rd, CL_GONE_REFUSED, reply->str);
	} else if (reply->type == REDIS_REPLY_ERROR) {
		cl_row_err(rd->cs, rd->row, ERR_REPLY);
		cl_log_refusal(SL_LOG_ERROR, "AUTH refused", reply->str);
		drop_as(rd, CL_GONE_REFUSED, "AUTH refused");
	} else if (rd->greet)
		cl_redis_answered(rd);
}

/*
 * The answer to ROLE, behind the greeting: a server that is not a master
 * (a replica, a sentinel) must not get the leases. An error (a Redis
 * older than ROLE) is not a refusal.
 */
static void
role_cb(redisAsyncContext *ac, void *r, void *priv)
{
	struct cl_redis *rd = priv;
	redisReply *reply = r;
	char why[128];

	if (reply == NULL || ac != rd->ac || reply->type != REDIS_REPLY_ARRAY ||
	    reply->elements < 1 || reply->element[0]->type != REDIS_REPLY_STRING ||
	    strcmp(reply->element[0]->str, "master") == 0)
		return;
	snprintf(why, sizeof(why), "%s:%d is not a master (ROLE: %s)",
	    rd->addr.host, rd->addr.port, reply->element[0]->str);
	cl_row_err(rd->cs, rd->row, ERR_REPLY);
	drop_as(rd, CL_GONE_REFUSED, why);
}

/* The polled owner's event hooks: it polls for what they ask. */
static void poll_add_read(void *p) { ((struct cl_redis *)p)->want_read = 1; }
static void poll_del_read(void *p) { ((struct cl_redis *)p)->want_read = 0; }
static void poll_add_write(void *p) { ((struct cl_redis *)p)->want_write = 1; }
static void poll_del_write(void *p) { ((struct cl_redis *)p)->want_write = 0; }
static void
poll_cleanup(void *p)
{
	struct cl_redis *rd = p;

	rd->want_read = rd->want_write = 0;
}

int
cl_redis_open(struct cl_redis *rd)
{
	redisAsyncContext *ac;

	if ((ac = async_open(&rd->addr)) == NULL) {
		cl_row_err(rd->cs, rd->row, ERR_CONNECT);
		return -1;
	}
	ac->data = rd;
	if (rd->loop != NULL) {
		if (redisLibevAttach(rd->loop, ac) != REDIS_OK) {
			redisAsyncFree(ac);
			return -1;
		}
	} else {
		ac->ev.data = rd;
		ac->ev.addRead = poll_add_read;
		ac->ev.delRead = poll_del_read;
		ac->ev.addWrite = poll_add_write;
		ac->ev.delWrite = poll_del_write;
		ac->ev.cleanup = poll_cleanup;
	}
	redisAsyncSetConnectCallback(ac, on_connect);
	redisAsyncSetDisconnectCallback(ac, on_disconnect);
	rd->ac = ac;
	rd->connected = 0;
	rd->want_read = rd->want_write = 0;
	/* Queued before the connect completes; hiredis sends them in order. */
	if (rd->password != NULL)
		redisAsyncCommand(ac, greet_cb, rd, "AUTH %s", rd->password);
	else if (rd->greet)
		redisAsyncCommand(ac, greet_cb, rd, "PING");
	if (rd->check_role)
		redisAsyncCommand(ac, role_cb, rd, "ROLE");
	return 0;
}

void
cl_redis_set_addr(struct cl_redis *rd, const char *redis)
{
	addr_parse(redis, &rd->addr);
}

double
cl_redis_backoff_next(struct cl_redis *rd)
{
	double d = rd->backoff;

	rd->backoff = rd->backoff * 2 > BACKOFF_MAX ? BACKOFF_MAX : rd->backoff * 2;
	return d;
}

void
cl_redis_answered(struct cl_redis *rd)
{
	rd->backoff = BACKOFF_MIN;
}

double
cl_redis_connect_limit(uint64_t timeout_ms)
{
	return (double)timeout_ms / 1000.0 * 10 < 1.0 ? 1.0 :
	    (double)timeout_ms / 1000.0 * 10;
}

/* ---- scripts ---------------------------------------------------------- */

int
cl_redis_load(struct cl_redis *rd, const char *script, size_t len,
    redisCallbackFn *cb, void *priv)
{
	const char *argv[3] = { "SCRIPT", "LOAD", script };
	size_t argl[3] = { 6, 4, len };

	return redisAsyncCommandArgv(rd->ac, cb, priv, 3, argv, argl);
}

void
cl_redis_take_sha(const redisReply *reply, char sha[41])
{
	if (reply->type == REDIS_REPLY_STRING && reply->len == 40)
		memcpy(sha, reply->str, 41);
}

/* ---- a polled connection ---------------------------------------------- */

int
cl_redis_pollfd(const struct cl_redis *rd, struct pollfd *pfd)
{
	if (rd->ac == NULL || rd->ac->c.fd < 0)
		return 0;
	pfd->fd = rd->ac->c.fd;
	pfd->events = (short)((rd->want_read ? POLLIN : 0) |
	    (rd->want_write ? POLLOUT : 0));
	pfd->revents = 0;
	return 1;
}

void
cl_redis_handle(struct cl_redis *rd, const struct pollfd *pfd)
{
	if (rd->ac == NULL || pfd->fd != rd->ac->c.fd)
		return;
	if (pfd->revents & (POLLIN | POLLERR | POLLHUP))
		redisAsyncHandleRead(rd->ac);
	if (rd->ac != NULL && (pfd->revents & (POLLOUT | POLLERR)))
		redisAsyncHandleWrite(rd->ac);
}

/* ---- a blocking connection -------------------------------------------- */

redisContext *
cl_redis_open_sync(const struct cl_redis *rd, struct timeval tv)
{
	redisContext *c;

	if (rd->addr.path != NULL)
		c = redisConnectUnixWithTimeout(rd->addr.path, tv);
	else
		c = redisConnectWithTimeout(rd->addr.host, rd->addr.port, tv);
	if (c != NULL && !c->err)
		redisSetTimeout(c, tv);
	return c;
}

int
cl_redis_auth_sync(struct cl_redis *rd, redisContext *c)
{
	redisReply *r;

	if (rd->password == NULL)
		return 0;
	r = redisCommand(c, "AUTH %s", rd->password);
	if (cl_reply_is_error(r)) {
		cl_row_err(rd->cs, rd->row, ERR_REPLY);
		cl_log_refusal(SL_LOG_ERROR, "AUTH refused", r ? r->str : c->errstr);
		freeReplyObject(r);
		return -1;
	}
	freeReplyObject(r);
	return 0;
}
