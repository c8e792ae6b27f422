/*
 * Active health probes of pool replicas, run by the master through
 * libcurl's multi interface (see sl_probe.h).
 */
#include "config.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <unistd.h>

#include <curl/curl.h>

#include "sl_log.h"
#include "sl_probe.h"

#define PROBE_BODY_MAX 4096          /* what a health answer may carry */

struct probe {
	const struct sl_upstream_conf *up;
	const struct sl_replica_conf *rep;
	size_t slot;                 /* shared index */
	char *url;
	CURL *easy;                  /* non-NULL while a probe runs */
	double next_at;              /* when the next probe starts */
	int oks, fails;              /* in a row */
	size_t body;                 /* bytes of the current answer */
};

struct sl_prober {
	CURLM *multi;
	struct sl_shm *shm;
	struct probe *p;
	size_t n;
};

static size_t
discard_cb(char *ptr, size_t size, size_t nmemb, void *arg)
{
	struct probe *p = arg;
	size_t n = size * nmemb;

	(void)ptr;
	p->body += n;
	return p->body > PROBE_BODY_MAX ? 0 : n;   /* an endless answer fails */
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
		}
	}
	if (n == 0)
		return pr;
	if ((pr->p = calloc(n, sizeof(*pr->p))) == NULL ||
	    (pr->multi = curl_multi_init()) == NULL)
		goto fail;
	for (u = 0; u < cfg->nupstreams; u++) {
		const struct sl_upstream_conf *up = &cfg->upstreams[u];
		const char *path = up->health.path ? up->health.path : "/health";

		if (!up->health.enabled)
			continue;
		for (r = 0; r < up->nreplicas; r++) {
			struct probe *p = &pr->p[k++];
			size_t a = strlen(up->replicas[r].url), b = strlen(path);

			p->up = up;
			p->rep = &up->replicas[r];
			p->slot = replica_slot[u][r];
			if ((p->url = malloc(a + b + 1)) == NULL)
				goto fail;
			memcpy(p->url, up->replicas[r].url, a);
			memcpy(p->url + a, path, b + 1);
			p->next_at = 0;   /* at once */
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
	}
	if (pr->multi != NULL)
		curl_multi_cleanup(pr->multi);
	free(pr->p);
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
	fd_set rd, wr, ex;
	int maxfd = probe_fdset(pr, &rd, &wr, &ex), fd;

	for (fd = 0; fd <= maxfd; fd++)
		if (FD_ISSET(fd, &rd) || FD_ISSET(fd, &wr) || FD_ISSET(fd, &ex))
			close(fd);
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

	p->next_at = now + (double)p->up->health.interval_ms / 1000.0;
	if (e == NULL)
		return;
	p->body = 0;
	curl_easy_setopt(e, CURLOPT_URL, p->url);
	curl_easy_setopt(e, CURLOPT_PRIVATE, p);
	curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(e, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
	curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)p->up->health.timeout_ms);
	curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, discard_cb);
	curl_easy_setopt(e, CURLOPT_WRITEDATA, p);
	curl_easy_setopt(e, CURLOPT_USERAGENT, "sluice-health/" PACKAGE_VERSION);
	/* A fresh connection each time: what a new stream would need. */
	curl_easy_setopt(e, CURLOPT_FORBID_REUSE, 1L);
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
		if (p != NULL)
			probe_done(pr, p, rc);
		curl_multi_remove_handle(pr->multi, e);
		curl_easy_cleanup(e);
		if (p != NULL)
			p->easy = NULL;
	}
}
