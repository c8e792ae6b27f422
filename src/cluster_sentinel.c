/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * With cluster.sentinels (cluster_int.h): where the master holding the
 * leases is. Only the master process asks; it publishes the answer in
 * the region for its workers (cl_addr_publish), so a node asks the
 * sentinels once per failover, not once per worker, and all its workers
 * follow the same answer.
 *
 * Asking is blocking, each sentinel bounded by cluster.timeout: the
 * master process asks at start and when its connection fails, moments
 * in which it has nothing else to say to Redis. Following is not: one
 * polled connection to a sentinel, subscribed to +switch-master, tells
 * of a failover the moment the sentinels decide it.
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>

#include "cluster_int.h"

#define SWITCH_CHANNEL "+switch-master"
/*
 * How often the subscription is probed: SUBSCRIBE again (idempotent, and
 * answered in subscribed mode where a PING's answer is not delivered by
 * hiredis 0.14). A sentinel that stalls with its connection open (stopped,
 * wedged) is left within this plus timeout_s.
 */
#define SUB_PROBE_S 2.0

struct cl_sentinel {
	char **addrs;                /* the configured sentinels, in order */
	size_t n;
	char *name;                  /* cluster.master_name */
	char *password;              /* the sentinels'; NULL: no AUTH */
	char (*said)[256];           /* per sentinel, the failure last logged:
	                                the same one again is not */
	int failing;                 /* the last ask found no master */
	char disagreed[256];         /* the last disagreement logged */

	struct cl_redis sub;         /* the subscription, polled */
	size_t sub_at;               /* which sentinel it is to */
	double sub_connect_at;       /* next attempt */
	double sub_deadline;         /* of the connect in progress */
	double timeout_s;            /* a connect's limit */
	int subscribed;              /* the last SUBSCRIBE is answered */
	int probing;                 /* it is a probe, not the first */
	double probe_at;             /* when subscribed: the next probe */
	uint64_t timeout_ms;         /* cluster.timeout, for the log */
	/* A +switch-master for our name, until cl_sentinel_switched. */
	int switched;
	char sw_addr[80];
	char sw_who[80];
};

/* "IP:port", or "[v6]:port" when ip has a colon. */
static void
addr_fmt(char *dst, size_t len, const char *ip, const char *port)
{
	if (strchr(ip, ':') != NULL)
		snprintf(dst, len, "[%s]:%s", ip, port);
	else
		snprintf(dst, len, "%s:%s", ip, port);
}

/*
 * An IP literal and a port: what a node may connect to. A sentinel with
 * announce-hostnames answers host names, and hiredis would resolve one
 * with a blocking lookup in the master's and every worker's loop.
 */
static int
addr_ok(const char *ip, const char *port)
{
	unsigned char bin[16];
	char *end;
	long p = strtol(port, &end, 10);

	return *port != '\0' && *end == '\0' && p > 0 && p <= 65535 &&
	    (inet_pton(AF_INET, ip, bin) == 1 || inet_pton(AF_INET6, ip, bin) == 1);
}

/* ---- asking ----------------------------------------------------------- */

/*
 * A sentinel refusing us, said with the key to fix: cluster.password is
 * the master's, not theirs.
 */
static void
auth_why(char *why, size_t wlen, const char *str)
{
	if (str != NULL && strncmp(str, "NOAUTH", 6) == 0)
		snprintf(why, wlen, "it wants a password: %s (set "
		    "cluster.sentinel_password)", str);
	else
		snprintf(why, wlen, "AUTH refused: %s (check "
		    "cluster.sentinel_password)", str != NULL ? str : "(no reply)");
}

/* A failed read: a sentinel that is silent says so, not EAGAIN. */
static void
io_why(struct cl_sentinel *s, const redisContext *c, char *why, size_t wlen)
{
	if (c->err == REDIS_ERR_IO &&
	    (strcmp(c->errstr, strerror(EAGAIN)) == 0 ||
	    strcmp(c->errstr, strerror(EWOULDBLOCK)) == 0))
		snprintf(why, wlen, "no answer within cluster.timeout (%" PRIu64
		    "ms)", s->timeout_ms);
	else
		snprintf(why, wlen, "%s", c->errstr);
}

/*
 * One sentinel's answer: 1 and addr, 0 nil (it does not monitor the
 * name), -1 unreachable or a bad answer (why).
 */
static int
ask_one(struct cl_sentinel *s, size_t i, struct timeval tv, char *addr,
    size_t alen, char *why, size_t wlen)
{
	struct cl_redis probe;
	redisContext *c;
	redisReply *r = NULL;
	int rc = -1;

	cl_redis_init(&probe, s->addrs[i], NULL, NULL, 0, NULL, 0, NULL, NULL);
	c = cl_redis_open_sync(&probe, tv);
	if (c == NULL || c->err) {
		snprintf(why, wlen, "%s", c != NULL ? c->errstr : "out of memory");
		goto out;
	}
	if (s->password != NULL) {
		r = redisCommand(c, "AUTH %s", s->password);
		if (r == NULL) {
			io_why(s, c, why, wlen);
			goto out;
		}
		if (cl_reply_is_error(r)) {
			auth_why(why, wlen, r->str);
			goto out;
		}
		freeReplyObject(r);
	}
	r = redisCommand(c, "SENTINEL get-master-addr-by-name %s", s->name);
	if (r == NULL)
		io_why(s, c, why, wlen);
	else if (r->type == REDIS_REPLY_ERROR && r->str != NULL &&
	    strncmp(r->str, "NOAUTH", 6) == 0)
		auth_why(why, wlen, r->str);
	else if (r->type == REDIS_REPLY_NIL) {
		snprintf(why, wlen, "it does not monitor '%s' (nil)", s->name);
		rc = 0;
	} else if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
	    r->element[0]->type == REDIS_REPLY_STRING &&
	    r->element[1]->type == REDIS_REPLY_STRING &&
	    addr_ok(r->element[0]->str, r->element[1]->str)) {
		addr_fmt(addr, alen, r->element[0]->str, r->element[1]->str);
		rc = 1;
	} else if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
	    r->element[0]->type == REDIS_REPLY_STRING &&
	    r->element[1]->type == REDIS_REPLY_STRING &&
	    strspn(r->element[1]->str, "0123456789") == r->element[1]->len &&
	    r->element[1]->len > 0 && atoi(r->element[1]->str) > 0)
		snprintf(why, wlen, "it names master '%s' by host name '%.80s' "
		    "(not resolved: set the sentinels' announce-hostnames no)",
		    s->name, r->element[0]->str);
	else
		snprintf(why, wlen, "unexpected answer: %s",
		    r->type == REDIS_REPLY_ERROR ? r->str : "not [ip, port]");
out:
	freeReplyObject(r);
	if (c != NULL)
		redisFree(c);
	return rc;
}

int
cl_sentinel_ask(struct cl_sentinel *s, uint64_t timeout_ms, char *addr,
    size_t alen, char *who, size_t wlen)
{
	struct timeval tv;
	char (*ans)[80], why[256];
	int *votes, best = -1, rc = -1;
	size_t i, j, answered = 0, reachable = 0;

	tv.tv_sec = (time_t)(timeout_ms / 1000);
	tv.tv_usec = (suseconds_t)((timeout_ms % 1000) * 1000);
	ans = calloc(s->n, sizeof(*ans));
	votes = calloc(s->n, sizeof(*votes));
	if (ans == NULL || votes == NULL)
		goto out;
	for (i = 0; i < s->n; i++) {
		int k = ask_one(s, i, tv, ans[i], sizeof(ans[i]), why, sizeof(why));

		if (k == -1 || k == 0) {
			ans[i][0] = '\0';
			if (k == 0)
				reachable++;
			if (strcmp(s->said[i], why) != 0)
				sl_warn("cluster: sentinel %s: %s", s->addrs[i], why);
			memcpy(s->said[i], why, sizeof(s->said[i]));
			continue;
		}
		reachable++;
		answered++;
		for (j = 0; j <= i; j++)
			if (strcmp(ans[j], ans[i]) == 0)
				break;
		votes[j]++;
		if (best == -1 || votes[j] > votes[best])
			best = (int)j;
		/* A majority of all of them: the others cannot outvote it. */
		if ((size_t)votes[best] * 2 > s->n)
			break;
	}
	if (best == -1) {
		if (s->failing++ == 0)
			sl_warn("cluster: no sentinel of %zu knows master '%s' (%zu "
			    "reachable); asking again with backoff", s->n, s->name,
			    reachable);
		goto out;
	}
	/*
	 * Of those that name one: a nil is a sentinel not watching it. The
	 * same disagreement, or the same sentinel saying the same other
	 * address, is logged once, not at every ask (every reconnect).
	 */
	if ((size_t)votes[best] * 2 <= answered) {
		snprintf(why, sizeof(why), "%d of %zu that answered say %s",
		    votes[best], answered, ans[best]);
		if (strcmp(s->disagreed, why) != 0)
			sl_warn("cluster: the sentinels disagree on master '%s' "
			    "(%s): asking again", s->name, why);
		memcpy(s->disagreed, why, sizeof(why));
		goto out;
	}
	s->disagreed[0] = '\0';
	for (j = 0; j < s->n; j++) {
		if (ans[j][0] == '\0')
			continue;
		if (strcmp(ans[j], ans[best]) == 0) {
			s->said[j][0] = '\0';
			continue;
		}
		snprintf(why, sizeof(why), "says %s; the majority says %s",
		    ans[j], ans[best]);
		if (strcmp(s->said[j], why) != 0)
			sl_warn("cluster: sentinel %s says master '%s' is %s; the "
			    "majority (%d of %zu that answered) says %s", s->addrs[j],
			    s->name, ans[j], votes[best], answered, ans[best]);
		memcpy(s->said[j], why, sizeof(why));
	}
	snprintf(addr, alen, "%s", ans[best]);
	snprintf(who, wlen, "%s", s->addrs[best]);
	s->failing = 0;
	rc = 0;
out:
	free(ans);
	free(votes);
	return rc;
}

/* ---- following: the +switch-master subscription ----------------------- */

static void sub_up(struct cl_redis *);
static void sub_gone(struct cl_redis *, enum cl_gone, const char *);
static const struct cl_redis_hooks sub_hooks = { sub_up, sub_gone };

/*
 * Every message of the channel: "NAME OLDIP OLDPORT NEWIP NEWPORT".
 * Only records it; the master acts on it from its loop.
 */
static void
sub_cb(redisAsyncContext *ac, void *r, void *priv)
{
	struct cl_sentinel *s = priv;
	redisReply *reply = r, *p;
	char name[80], oip[64], oport[8], nip[64], nport[8];

	if (reply == NULL || ac != s->sub.ac)
		return;
	if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 3 ||
	    reply->element[0]->type != REDIS_REPLY_STRING)
		return;
	if (strcmp(reply->element[0]->str, "subscribe") == 0) {
		s->subscribed = 1;
		s->probe_at = sl_mono_s() + SUB_PROBE_S;
		cl_redis_answered(&s->sub);
		if (!s->probing)
			sl_debug("cluster: following master '%s' through sentinel "
			    "%s", s->name, s->addrs[s->sub_at]);
		s->probing = 0;
		return;
	}
	p = reply->element[2];
	if (strcmp(reply->element[0]->str, "message") != 0 ||
	    p->type != REDIS_REPLY_STRING)
		return;
	if (sscanf(p->str, "%79s %63s %7s %63s %7s", name, oip, oport, nip,
	    nport) != 5 || strcmp(name, s->name) != 0)
		return;
	if (!addr_ok(nip, nport)) {
		/* Not followed: the next ask refuses it, and says why. */
		sl_warn("cluster: sentinel %s: +switch-master to '%s %s' is not "
		    "an IP address and port; not followed", s->addrs[s->sub_at],
		    nip, nport);
		return;
	}
	addr_fmt(s->sw_addr, sizeof(s->sw_addr), nip, nport);
	snprintf(s->sw_who, sizeof(s->sw_who), "%s", s->addrs[s->sub_at]);
	s->switched = 1;
}

static void
sub_up(struct cl_redis *rd)
{
	(void)rd;
}

static void
sub_gone(struct cl_redis *rd, enum cl_gone how, const char *why)
{
	struct cl_sentinel *s = rd->owner;
	char msg[256];

	s->subscribed = 0;
	s->probing = 0;
	if (how == CL_GONE_REFUSED) {
		/* Its AUTH (or PING) refused: logged as the asking does, once. */
		auth_why(msg, sizeof(msg), why);
		if (strcmp(s->said[s->sub_at], msg) != 0)
			sl_warn("cluster: sentinel %s: %s", s->addrs[s->sub_at], msg);
		memcpy(s->said[s->sub_at], msg, sizeof(msg));
	} else if (how == CL_GONE_DROPPED && why != NULL &&
	    strncmp(why, "no answer", 9) == 0) {
		/* A stalled sentinel: worth a line, once. */
		snprintf(msg, sizeof(msg), "%s; following through the next "
		    "sentinel", why);
		if (strcmp(s->said[s->sub_at], msg) != 0)
			sl_warn("cluster: sentinel %s: %s", s->addrs[s->sub_at], msg);
		memcpy(s->said[s->sub_at], msg, sizeof(msg));
	} else if (how != CL_GONE_FAILED || s->n == 1)
		sl_debug("cluster: sentinel %s: subscription gone: %s",
		    s->addrs[s->sub_at], why != NULL ? why : "closed");
	/* The next sentinel; the backoff grows once round all of them. */
	s->sub_at = (s->sub_at + 1) % s->n;
	s->sub_connect_at = sl_mono_s() +
	    (s->sub_at == 0 ? cl_redis_backoff_next(&s->sub) : 0.05);
}

static void
sub_connect(struct cl_sentinel *s)
{
	const char *argv[2] = { "SUBSCRIBE", SWITCH_CHANNEL };
	size_t argl[2] = { 9, sizeof(SWITCH_CHANNEL) - 1 };

	cl_redis_set_addr(&s->sub, s->addrs[s->sub_at]);
	if (cl_redis_open(&s->sub) == -1) {
		s->sub.ac = NULL;
		sub_gone(&s->sub, CL_GONE_FAILED, "cannot open a connection");
		return;
	}
	s->subscribed = 0;
	s->probing = 0;
	s->sub_deadline = sl_mono_s() + s->timeout_s;
	redisAsyncCommandArgv(s->sub.ac, sub_cb, s, 2, argv, argl);
}

/* SUBSCRIBE again on the open subscription: it must be answered in time. */
static void
sub_probe(struct cl_sentinel *s, double now)
{
	const char *argv[2] = { "SUBSCRIBE", SWITCH_CHANNEL };
	size_t argl[2] = { 9, sizeof(SWITCH_CHANNEL) - 1 };

	s->subscribed = 0;
	s->probing = 1;
	s->sub_deadline = now + s->timeout_s;
	redisAsyncCommandArgv(s->sub.ac, sub_cb, s, 2, argv, argl);
}

struct cl_sentinel *
cl_sentinel_new(const struct sl_config *cfg)
{
	const struct sl_cluster_conf *cl = &cfg->cluster;
	struct cl_sentinel *s;
	size_t i;

	if ((s = calloc(1, sizeof(*s))) == NULL)
		return NULL;
	if ((s->addrs = calloc(cl->nsentinels, sizeof(char *))) == NULL ||
	    (s->said = calloc(cl->nsentinels, sizeof(*s->said))) == NULL ||
	    (s->name = strdup(cl->master_name)) == NULL ||
	    (cl->sentinel_password != NULL &&
	    (s->password = strdup(cl->sentinel_password)) == NULL))
		goto fail;
	for (i = 0; i < cl->nsentinels; i++) {
		if ((s->addrs[i] = strdup(cl->sentinels[i])) == NULL)
			goto fail;
		s->n++;
	}
	/* Errors of the subscription are not Redis's: no region, no row. */
	cl_redis_init(&s->sub, s->addrs[0], s->password, NULL, 0, NULL, 1,
	    &sub_hooks, s);
	cl_sentinel_reconf(s, cl->timeout_ms);
	return s;
fail:
	cl_sentinel_free(s);
	return NULL;
}

void
cl_sentinel_reconf(struct cl_sentinel *s, uint64_t timeout_ms)
{
	s->timeout_s = cl_redis_connect_limit(timeout_ms);
	s->timeout_ms = timeout_ms;
}

void
cl_sentinel_free(struct cl_sentinel *s)
{
	size_t i;

	if (s == NULL)
		return;
	if (s->sub.ac != NULL) {
		redisAsyncContext *ac = s->sub.ac;

		s->sub.ac = NULL;   /* no hook: leaving */
		redisAsyncFree(ac);
	}
	for (i = 0; s->addrs != NULL && i < s->n; i++)
		free(s->addrs[i]);
	free(s->addrs);
	free(s->said);
	free(s->name);
	free(s->password);
	free(s);
}

void
cl_sentinel_close_in_child(struct cl_sentinel *s)
{
	if (s != NULL && s->sub.ac != NULL && s->sub.ac->c.fd >= 0)
		close(s->sub.ac->c.fd);
}

int
cl_sentinel_pollfd(const struct cl_sentinel *s, struct pollfd *pfd)
{
	return cl_redis_pollfd(&s->sub, pfd);
}

double
cl_sentinel_timeout(const struct cl_sentinel *s, double now)
{
	double t = s->sub.ac == NULL ? s->sub_connect_at :
	    !s->subscribed ? s->sub_deadline : s->probe_at;

	return t > now ? t - now : 0;
}

void
cl_sentinel_service(struct cl_sentinel *s, const struct pollfd *pfd, int n,
    double now)
{
	if (n > 0)
		cl_redis_handle(&s->sub, pfd);
	/*
	 * Until SUBSCRIBE is answered, not only connected: a sentinel that
	 * accepts and never answers would otherwise hold the subscription,
	 * and the node would hear of no failover, for ever.
	 */
	if (s->sub.ac != NULL && !s->subscribed && now >= s->sub_deadline)
		cl_redis_drop(&s->sub, s->sub.connected ?
		    "no answer to SUBSCRIBE in time" : "connect timed out");
	if (s->sub.ac != NULL && s->subscribed && now >= s->probe_at)
		sub_probe(s, now);
	if (s->sub.ac == NULL && now >= s->sub_connect_at)
		sub_connect(s);
}

int
cl_sentinel_switched(struct cl_sentinel *s, char *addr, size_t alen,
    char *who, size_t wlen)
{
	if (!s->switched)
		return 0;
	s->switched = 0;
	snprintf(addr, alen, "%s", s->sw_addr);
	snprintf(who, wlen, "%s", s->sw_who);
	return 1;
}

const char *
cl_sentinel_name(const struct cl_sentinel *s)
{
	return s->name;
}
