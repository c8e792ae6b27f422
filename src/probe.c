/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * Active health probes of pool replicas, run by the master through
 * libcurl's multi interface (see sl_probe.h).
 */
#include "config.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <unistd.h>

#include <curl/curl.h>

#include "sl_loadmetrics.h"
#include "sl_log.h"
#include "sl_probe.h"
#include "sl_upstream.h"

#define PROBE_BODY_MAX 4096          /* what a health answer may carry */
#define SCRAPE_BODY_MAX (4 << 20)    /* a metrics page; vLLM's is ~100 KiB */
#define SCRAPE_TIMEOUT_MAX_MS 10000

enum probe_kind { PROBE_HEALTH = 0, PROBE_LOAD };

struct probe {
	const struct sl_upstream_conf *up;
	const struct sl_replica_conf *rep;
	size_t slot;                 /* shared index */
	char *url;
	CURL *easy;                  /* non-NULL while a probe runs */
	double next_at;              /* when the next probe starts */
	int oks, fails;              /* in a row */
	size_t body;                 /* bytes of the current answer */
	enum probe_kind kind;
	char *buf;                   /* load: the page, kept between scrapes */
	size_t cap;
	int failing;                 /* load: last scrape failed (logged once) */
	int too_big;                 /* load: the page passed SCRAPE_BODY_MAX */
};

struct sl_prober {
	CURLM *multi;
	struct sl_shm *shm;
	struct probe *p;
	size_t n;
	/*
	 * Every socket libcurl opened for probes and scrapes and has not
	 * closed, idle ones in its connection cache included: a worker
	 * forked now closes them all (curl_multi_fdset only shows those of
	 * running transfers, and a kept scrape connection would otherwise
	 * stay open in every worker forked while it was idle).
	 */
	int *fds;
	size_t nfds, capfds;
};

static curl_socket_t
probe_open_cb(void *arg, curlsocktype purpose, struct curl_sockaddr *a)
{
	struct sl_prober *pr = arg;
	int fd;

	(void)purpose;
	if (pr->nfds == pr->capfds) {
		size_t cap = pr->capfds ? 2 * pr->capfds : 16;
		int *n = realloc(pr->fds, cap * sizeof(*n));

		if (n == NULL)
			return CURL_SOCKET_BAD;
		pr->fds = n;
		pr->capfds = cap;
	}
	fd = socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
	if (fd == -1)
		return CURL_SOCKET_BAD;
	pr->fds[pr->nfds++] = fd;
	return fd;
}

static int
probe_close_cb(void *arg, curl_socket_t fd)
{
	struct sl_prober *pr = arg;
	size_t i;

	for (i = 0; i < pr->nfds; i++)
		if (pr->fds[i] == fd) {
			pr->fds[i] = pr->fds[--pr->nfds];
			break;
		}
	return close(fd);
}

static size_t
discard_cb(char *ptr, size_t size, size_t nmemb, void *arg)
{
	struct probe *p = arg;
	size_t n = size * nmemb;

	(void)ptr;
	p->body += n;
	return p->body > PROBE_BODY_MAX ? 0 : n;   /* an endless answer fails */
}

/* A metrics page, kept whole (up to SCRAPE_BODY_MAX) for the parser. */
static size_t
keep_cb(char *ptr, size_t size, size_t nmemb, void *arg)
{
	struct probe *p = arg;
	size_t n = size * nmemb;

	if (p->body + n > SCRAPE_BODY_MAX) {
		p->too_big = 1;   /* said so in the log, not "writing failed" */
		return 0;
	}
	if (p->body + n > p->cap) {
		size_t cap = p->cap ? p->cap : 16384;
		char *b;

		while (cap < p->body + n)
			cap *= 2;
		if (cap > SCRAPE_BODY_MAX)
			cap = SCRAPE_BODY_MAX;
		if ((b = realloc(p->buf, cap)) == NULL)
			return 0;
		p->buf = b;
		p->cap = cap;
	}
	memcpy(p->buf + p->body, ptr, n);
	p->body += n;
	return n;
}

/* "BASE" + "PATH", malloc'd. */
static char *
join_url(const char *base, const char *path)
{
	size_t a = strlen(base), b = strlen(path);
	char *u;

	if ((u = malloc(a + b + 1)) == NULL)
		return NULL;
	memcpy(u, base, a);
	memcpy(u + a, path, b + 1);
	return u;
}

struct sl_prober *
sl_probe_new(const struct sl_config *cfg, struct sl_shm *shm,
    size_t *const *replica_slot)
{
	struct sl_prober *pr;
	size_t u, r, n = 0, k = 0;

	if ((pr = calloc(1, sizeof(*pr))) == NULL)
		return NULL;
	pr->shm = shm;
	for (u = 0; u < cfg->nupstreams; u++) {
		const struct sl_upstream_conf *up = &cfg->upstreams[u];

		for (r = 0; r < up->nreplicas; r++) {
			struct sl_shm_replica *h = sl_shm_replica(shm,
			    replica_slot[u][r]);

			if (up->health.enabled)
				n++;
			else if (h != NULL)
				atomic_store(&h->down, 0);   /* nobody probes it */
			if (up->load_metrics.enabled)
				n++;
			else if (h != NULL)
				atomic_store(&h->lm_at_ms, 0);   /* no sample */
		}
	}
	if (n == 0)
		return pr;
	if ((pr->p = calloc(n, sizeof(*pr->p))) == NULL ||
	    (pr->multi = curl_multi_init()) == NULL)
		goto fail;
	for (u = 0; u < cfg->nupstreams; u++) {
		const struct sl_upstream_conf *up = &cfg->upstreams[u];
		int kind;

		for (kind = PROBE_HEALTH; kind <= PROBE_LOAD; kind++) {
			const char *path;

			if (kind == PROBE_HEALTH && !up->health.enabled)
				continue;
			if (kind == PROBE_LOAD && !up->load_metrics.enabled)
				continue;
			if (kind == PROBE_HEALTH)
				path = up->health.path ? up->health.path :
				    "/health";
			else
				path = up->load_metrics.path ?
				    up->load_metrics.path : "/metrics";
			for (r = 0; r < up->nreplicas; r++) {
				struct probe *p = &pr->p[k++];

				p->up = up;
				p->rep = &up->replicas[r];
				p->slot = replica_slot[u][r];
				p->kind = (enum probe_kind)kind;
				if ((p->url = join_url(up->replicas[r].url,
				    path)) == NULL)
					goto fail;
				p->next_at = 0;   /* at once */
			}
		}
	}
	pr->n = n;
	return pr;
fail:
	pr->n = k;
	sl_probe_free(pr);
	return NULL;
}

void
sl_probe_free(struct sl_prober *pr)
{
	size_t i;

	if (pr == NULL)
		return;
	for (i = 0; i < pr->n; i++) {
		if (pr->p[i].easy != NULL) {
			curl_multi_remove_handle(pr->multi, pr->p[i].easy);
			curl_easy_cleanup(pr->p[i].easy);
		}
		free(pr->p[i].url);
		free(pr->p[i].buf);
	}
	if (pr->multi != NULL)
		curl_multi_cleanup(pr->multi);   /* closes the cached ones */
	free(pr->p);
	free(pr->fds);
	free(pr);
}

/* The probes' sockets as libcurl reports them: the highest fd, or -1. */
static int
probe_fdset(struct sl_prober *pr, fd_set *rd, fd_set *wr, fd_set *ex)
{
	int maxfd = -1;

	FD_ZERO(rd);
	FD_ZERO(wr);
	FD_ZERO(ex);
	if (pr == NULL || pr->multi == NULL ||
	    curl_multi_fdset(pr->multi, rd, wr, ex, &maxfd) != CURLM_OK)
		return -1;
	return maxfd;
}

void
sl_probe_close_in_child(struct sl_prober *pr)
{
	size_t i;

	if (pr == NULL)
		return;
	for (i = 0; i < pr->nfds; i++)
		close(pr->fds[i]);
}

int
sl_probe_pollfds(struct sl_prober *pr, struct pollfd *pfd, int max)
{
	fd_set rd, wr, ex;
	int maxfd = probe_fdset(pr, &rd, &wr, &ex), fd, n = 0;

	for (fd = 0; fd <= maxfd && n < max; fd++) {
		short ev = (short)((FD_ISSET(fd, &rd) ? POLLIN : 0) |
		    (FD_ISSET(fd, &wr) ? POLLOUT : 0) |
		    (FD_ISSET(fd, &ex) ? POLLPRI : 0));

		if (ev == 0)
			continue;
		pfd[n].fd = fd;
		pfd[n].events = ev;
		pfd[n].revents = 0;
		n++;
	}
	return n;
}

double
sl_probe_timeout(struct sl_prober *pr, double now)
{
	double t = 0;
	long ms = -1;
	int have = 0;
	size_t i;

	if (pr == NULL || pr->n == 0)
		return -1;
	for (i = 0; i < pr->n; i++)
		if (pr->p[i].easy == NULL &&
		    (!have || pr->p[i].next_at - now < t)) {
			t = pr->p[i].next_at - now;
			have = 1;
		}
	if (curl_multi_timeout(pr->multi, &ms) == CURLM_OK && ms >= 0) {
		/* libcurl's own deadline (connect, timeout, a resolve). */
		double c = (double)ms / 1000.0;

		if (!have || c < t)
			t = c;
		have = 1;
	}
	if (!have)
		return -1;
	return t < 0.0 ? 0.0 : t;
}

/*
 * A scrape's result: publish the runner's queue, running count and KV-cache
 * use for the workers. A failed scrape publishes nothing: the last sample
 * ages out after 4 intervals and the workers go by their own counts.
 */
static void
scrape_done(struct sl_prober *pr, struct probe *p, CURLcode rc)
{
	struct sl_shm_replica *h = sl_shm_replica(pr->shm, p->slot);
	struct sl_load_sample ls;
	long status = 0;
	int found = 0;

	if (h == NULL)
		return;
	curl_easy_getinfo(p->easy, CURLINFO_RESPONSE_CODE, &status);
	memset(&ls, 0, sizeof(ls));
	if (rc == CURLE_OK && status == 200)
		found = sl_loadmetrics_parse(p->buf != NULL ? p->buf : "",
		    p->body, &ls);
	if (found == 0) {
		if (!p->failing)
			sl_warn("upstream %s: replica %s: no load sample from %s: "
			    "%s", p->up->name, p->rep->url, p->url,
			    p->too_big ? "the page is larger than 4 MiB" :
			    rc != CURLE_OK ? curl_easy_strerror(rc) :
			    status != 200 ? "not a 200 answer" :
			    "none of the known metrics on the page");
		p->failing = 1;
		return;
	}
	if (p->failing)
		sl_info("upstream %s: replica %s: load samples again from %s",
		    p->up->name, p->rep->url, p->url);
	p->failing = 0;
	atomic_store_explicit(&h->lm_waiting, ls.have_waiting ?
	    (int32_t)(ls.waiting > 1e6 ? 1e6 : ls.waiting) : -1,
	    memory_order_relaxed);
	atomic_store_explicit(&h->lm_running, ls.have_running ?
	    (int32_t)(ls.running > 1e6 ? 1e6 : ls.running) : -1,
	    memory_order_relaxed);
	atomic_store_explicit(&h->lm_kv, ls.have_kv ?
	    (int32_t)(ls.kv_cache * 1000.0 + 0.5) : -1, memory_order_relaxed);
	atomic_store_explicit(&h->lm_at_ms, sl_mono_ms(), memory_order_release);
}

/* One probe's result: count it, and move the replica up or down. */
static void
probe_done(struct sl_prober *pr, struct probe *p, CURLcode rc)
{
	struct sl_shm_replica *h = sl_shm_replica(pr->shm, p->slot);
	long status = 0;
	int ok, loading;

	curl_easy_getinfo(p->easy, CURLINFO_RESPONSE_CODE, &status);
	ok = rc == CURLE_OK && status >= 200 && status < 300;
	loading = rc == CURLE_OK && status == 503;
	if (h == NULL)
		return;
	if (ok) {
		p->fails = 0;
		/*
		 * The runner answers: a busy mark (its Retry-After) ends here,
		 * so a mark never outlives a good probe by more than one
		 * interval.
		 */
		if (atomic_exchange(&h->busy_until_ms, 0) > sl_mono_ms())
			sl_info("upstream %s: replica %s: busy mark cleared by "
			    "a good health probe", p->up->name, p->rep->url);
		if (++p->oks >= p->up->health.rise &&
		    atomic_load(&h->down) != 0) {
			atomic_store(&h->down, 0);
			sl_info("upstream %s: replica %s is up (%d good health "
			    "probes)", p->up->name, p->rep->url, p->oks);
		}
		return;
	}
	p->oks = 0;
	if (++p->fails < p->up->health.fall)
		return;
	if (loading) {
		if (atomic_exchange(&h->down, SL_REPLICA_LOADING) !=
		    SL_REPLICA_LOADING)
			sl_info("upstream %s: replica %s is loading (health "
			    "answers 503); it takes no traffic until it is up",
			    p->up->name, p->rep->url);
	} else if (atomic_exchange(&h->down, SL_REPLICA_DOWN) !=
	    SL_REPLICA_DOWN) {
		if (rc != CURLE_OK)
			sl_warn("upstream %s: replica %s is down: %s", p->up->name,
			    p->rep->url, curl_easy_strerror(rc));
		else
			sl_warn("upstream %s: replica %s is down: health answered "
			    "%ld", p->up->name, p->rep->url, status);
	}
}

static void
probe_start(struct sl_prober *pr, struct probe *p, double now)
{
	CURL *e = curl_easy_init();
	uint64_t iv = p->kind == PROBE_LOAD ? p->up->load_metrics.interval_ms :
	    p->up->health.interval_ms;

	p->next_at = now + (double)iv / 1000.0;
	if (e == NULL)
		return;
	p->body = 0;
	p->too_big = 0;
	curl_easy_setopt(e, CURLOPT_URL, p->url);
	curl_easy_setopt(e, CURLOPT_PRIVATE, p);
	curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(e, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
	curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(e, CURLOPT_NOPROXY, "*");   /* as the relay */
	curl_easy_setopt(e, CURLOPT_OPENSOCKETFUNCTION, probe_open_cb);
	curl_easy_setopt(e, CURLOPT_OPENSOCKETDATA, pr);
	curl_easy_setopt(e, CURLOPT_CLOSESOCKETFUNCTION, probe_close_cb);
	curl_easy_setopt(e, CURLOPT_CLOSESOCKETDATA, pr);
	curl_easy_setopt(e, CURLOPT_WRITEDATA, p);
	if (p->kind == PROBE_LOAD) {
		/*
		 * A sample older than 4 intervals is ignored anyway; the
		 * connection is kept for the next scrape (4 a second by
		 * default: a new one each time would cost the runner more).
		 */
		uint64_t to = 4 * iv;

		if (to > SCRAPE_TIMEOUT_MAX_MS)
			to = SCRAPE_TIMEOUT_MAX_MS;
		curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)to);
		curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, keep_cb);
		curl_easy_setopt(e, CURLOPT_USERAGENT,
		    "sluice-load/" PACKAGE_VERSION);
	} else {
		curl_easy_setopt(e, CURLOPT_TIMEOUT_MS,
		    (long)p->up->health.timeout_ms);
		curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, discard_cb);
		curl_easy_setopt(e, CURLOPT_USERAGENT,
		    "sluice-health/" PACKAGE_VERSION);
		/* A fresh connection each time: what a new stream would need. */
		curl_easy_setopt(e, CURLOPT_FORBID_REUSE, 1L);
	}
	if (p->up->api_key != NULL) {
		/* Some runners guard every path with their key. */
		curl_easy_setopt(e, CURLOPT_XOAUTH2_BEARER, p->up->api_key);
		curl_easy_setopt(e, CURLOPT_HTTPAUTH, (long)CURLAUTH_BEARER);
	}
	if (curl_multi_add_handle(pr->multi, e) != CURLM_OK) {
		curl_easy_cleanup(e);
		return;
	}
	p->easy = e;
}

void
sl_probe_service(struct sl_prober *pr, double now)
{
	CURLMsg *msg;
	int running, left;
	size_t i;

	if (pr == NULL || pr->n == 0)
		return;
	for (i = 0; i < pr->n; i++)
		if (pr->p[i].easy == NULL && pr->p[i].next_at <= now)
			probe_start(pr, &pr->p[i], now);
	curl_multi_perform(pr->multi, &running);
	while ((msg = curl_multi_info_read(pr->multi, &left)) != NULL) {
		struct probe *p = NULL;
		CURL *e = msg->easy_handle;
		CURLcode rc = msg->data.result;

		if (msg->msg != CURLMSG_DONE)
			continue;
		curl_easy_getinfo(e, CURLINFO_PRIVATE, (char **)&p);
		if (p != NULL && p->kind == PROBE_LOAD)
			scrape_done(pr, p, rc);
		else if (p != NULL)
			probe_done(pr, p, rc);
		curl_multi_remove_handle(pr->multi, e);
		curl_easy_cleanup(e);
		if (p != NULL)
			p->easy = NULL;
	}
}
