/*
 * A worker process: one libev loop driving client sockets, the libcurl
 * multi handle (multi_socket API: one ev_io per curl socket, one ev_timer
 * for curl's timeout), accepts, and signals from the master.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <http_parser.h>

#include "sl_log.h"
#include "sl_relay.h"
#include "sl_worker.h"

#define ACCEPTS_PER_EVENT 64

/* One watcher per socket libcurl asks us to poll. */
struct curl_sock {
	ev_io io;
	struct sl_shard *sh;
	curl_socket_t fd;
};

static void
check_multi_info(struct sl_shard *sh)
{
	CURLMsg *msg;
	int left;

	while ((msg = curl_multi_info_read(sh->multi, &left)) != NULL) {
		if (msg->msg != CURLMSG_DONE)
			continue;
		/* The message dies with remove_handle: copy what we need. */
		sl_conn_upstream_done(sh, msg->easy_handle, msg->data.result);
	}
}

static void
curl_action(struct sl_shard *sh, curl_socket_t fd, int ev_bitmask)
{
	int running;
	CURLMcode rc;

	rc = curl_multi_socket_action(sh->multi, fd, ev_bitmask, &running);
	if (rc != CURLM_OK)
		sl_err("curl_multi_socket_action: %s", curl_multi_strerror(rc));
	check_multi_info(sh);
}

/*
 * What one upstream read produced (often a head, some events and the last
 * chunk) goes out in one writev right away: waiting for the end of the loop
 * iteration would hold every stream's event until all the others ready in
 * the same epoll batch are read (milliseconds at thousands of streams).
 */
static void
curl_sock_cb(struct ev_loop *loop, ev_io *io, int revents)
{
	struct curl_sock *cs = io->data;
	struct sl_worker *w = cs->sh->w;   /* cs may be freed by the action */
	int action = (revents & EV_READ ? CURL_CSELECT_IN : 0) |
	    (revents & EV_WRITE ? CURL_CSELECT_OUT : 0);

	curl_action(cs->sh, cs->fd, action);
	sl_conn_flush_dirty(w);
}

static void
curl_timer_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct sl_shard *sh = t->data;

	curl_action(sh, CURL_SOCKET_TIMEOUT, 0);
	sl_conn_flush_dirty(sh->w);
}

/* CURLMOPT_SOCKETFUNCTION: start, change or stop polling one socket. */
static int
multi_sock_cb(CURL *e, curl_socket_t fd, int what, void *userp, void *sockp)
{
	struct sl_shard *sh = userp;
	struct ev_loop *loop = sh->w->loop;
	struct curl_sock *cs = sockp;
	int kind;

	if (what == CURL_POLL_REMOVE) {
		if (cs != NULL) {
			ev_io_stop(loop, &cs->io);
			curl_multi_assign(sh->multi, fd, NULL);
			free(cs);
		}
		return 0;
	}
	kind = (what & CURL_POLL_IN ? EV_READ : 0) |
	    (what & CURL_POLL_OUT ? EV_WRITE : 0);
	if (cs == NULL) {
		/*
		 * A new socket: a fresh watcher (the fd number may be a reused
		 * one; its old watcher was freed on CURL_POLL_REMOVE).
		 */
		cs = calloc(1, sizeof(*cs));
		if (cs == NULL)
			return -1;
		cs->sh = sh;
		cs->fd = fd;
		curl_multi_assign(sh->multi, fd, cs);
		ev_io_init(&cs->io, curl_sock_cb, fd, kind);
		cs->io.data = cs;
		ev_io_start(loop, &cs->io);
		return 0;
	}
	if ((cs->io.events & (EV_READ | EV_WRITE)) == kind)
		return 0;
	/*
	 * Same socket, other events: ev_io_modify keeps libev from re-adding
	 * an fd epoll already has (a failing epoll_ctl per request).
	 */
	ev_io_stop(loop, &cs->io);
	ev_io_modify(&cs->io, kind);
	ev_io_start(loop, &cs->io);
	return 0;
}

/* CURLMOPT_TIMERFUNCTION: never call libcurl from here. */
static int
multi_timer_cb(CURLM *m, long timeout_ms, void *userp)
{
	struct sl_shard *sh = userp;

	ev_timer_stop(sh->w->loop, &sh->timer);
	if (timeout_ms >= 0) {
		ev_timer_set(&sh->timer, (double)timeout_ms / 1000.0, 0.0);
		ev_timer_start(sh->w->loop, &sh->timer);
	}
	return 0;
}

/*
 * SO_RCVBUF on every upstream socket before it connects, when configured:
 * a fixed receive buffer stops the kernel from autotuning it to tens of
 * megabytes, so a paused stream pushes back on the model runner after
 * stream_buffer + upstream_rcvbuf bytes, not after whatever tcp_rmem allows.
 */
static int
upstream_sockopt_cb(void *arg, curl_socket_t fd, curlsocktype purpose)
{
	struct sl_worker *w = arg;
	int v = (int)w->cfg->limits.upstream_rcvbuf;

	if (purpose == CURLSOCKTYPE_IPCXN && v > 0 &&
	    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof(v)) == -1)
		sl_warn("upstream SO_RCVBUF %d: %s", v, strerror(errno));
	return CURL_SOCKOPT_OK;
}

static int
shard_init(struct sl_worker *w, struct sl_shard *sh)
{
	memset(sh, 0, sizeof(*sh));
	if ((sh->multi = curl_multi_init()) == NULL)
		return -1;
	sh->w = w;
	curl_multi_setopt(sh->multi, CURLMOPT_SOCKETFUNCTION, multi_sock_cb);
	curl_multi_setopt(sh->multi, CURLMOPT_SOCKETDATA, sh);
	curl_multi_setopt(sh->multi, CURLMOPT_TIMERFUNCTION, multi_timer_cb);
	curl_multi_setopt(sh->multi, CURLMOPT_TIMERDATA, sh);
	/*
	 * Keep an idle connection for every stream the shard may carry (and
	 * as many again for a burst that spills over): a smaller cache closes
	 * a connection per finished transfer at full load, and the next
	 * request connects again.
	 */
	curl_multi_setopt(sh->multi, CURLMOPT_MAXCONNECTS,
	    (long)(2 * SL_SHARD_STREAMS));
	ev_init(&sh->timer, curl_timer_cb);
	sh->timer.data = sh;
	sh->idle_since = ev_now(w->loop);
	return 0;
}

struct sl_shard *
sl_worker_shard(struct sl_worker *w)
{
	struct sl_shard *best = NULL, *dormant = NULL, *sh;
	size_t i;

	/* The first live shard with room: a light load stays on shard 0. */
	for (i = 0; i < w->nshards; i++) {
		sh = &w->shards[i];
		if (sh->multi == NULL) {
			if (dormant == NULL)
				dormant = sh;
			continue;
		}
		if (sh->active < SL_SHARD_STREAMS)
			return sh;
		if (best == NULL || sh->active < best->active)
			best = sh;
	}
	if (dormant != NULL && shard_init(w, dormant) == 0)
		return dormant;
	if (w->nshards < w->maxshards &&
	    shard_init(w, &w->shards[w->nshards]) == 0)
		return &w->shards[w->nshards++];
	return best;
}

void
sl_worker_shard_done(struct sl_shard *sh)
{
	if (sh->active > 0 && --sh->active == 0)
		sh->idle_since = ev_now(sh->w->loop);
}

/* Close shards (not the first) idle for SL_SHARD_IDLE_SECONDS. */
static void
shards_reap(struct sl_worker *w)
{
	ev_tstamp now = ev_now(w->loop);
	size_t i;

	for (i = 1; i < w->nshards; i++) {
		struct sl_shard *sh = &w->shards[i];

		if (sh->multi == NULL || sh->active > 0 ||
		    now - sh->idle_since < SL_SHARD_IDLE_SECONDS)
			continue;
		curl_multi_cleanup(sh->multi);
		/* After: cleanup may still have set the timer through its callback. */
		ev_timer_stop(w->loop, &sh->timer);
		sh->multi = NULL;
	}
}

CURL *
sl_worker_easy_get(struct sl_worker *w)
{
	if (w->neasy > 0)
		return w->easy_pool[--w->neasy];
	return curl_easy_init();
}

void
sl_worker_easy_put(struct sl_worker *w, CURL *e)
{
	if (w->neasy < SL_EASY_POOL) {
		curl_easy_reset(e);
		w->easy_pool[w->neasy++] = e;
	} else {
		curl_easy_cleanup(e);
	}
}

void
sl_worker_easy_setopts(struct sl_worker *w, CURL *e)
{
	if (w->cfg->limits.upstream_rcvbuf > 0) {
		curl_easy_setopt(e, CURLOPT_SOCKOPTFUNCTION, upstream_sockopt_cb);
		curl_easy_setopt(e, CURLOPT_SOCKOPTDATA, w);
	}
}

static void
accept_cb(struct ev_loop *loop, ev_io *io, int revents)
{
	struct sl_worker *w = io->data;
	int i, fd;

	for (i = 0; i < ACCEPTS_PER_EVENT; i++) {
		fd = accept4(w->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd == -1) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno == EMFILE || errno == ENFILE) {
				/*
				 * Out of descriptors: use the spare one to take the
				 * connection off the queue and refuse it, so the
				 * client learns at once instead of timing out.
				 */
				if (w->spare_fd >= 0) {
					close(w->spare_fd);
					fd = accept4(w->listen_fd, NULL, NULL,
					    SOCK_NONBLOCK | SOCK_CLOEXEC);
					if (fd >= 0)
						sl_conn_refuse(w, fd);
					w->spare_fd = open("/dev/null",
					    O_RDONLY | O_CLOEXEC);
				}
				sl_warn("accept: %s; pausing accepts for 100 ms",
				    strerror(errno));
				ev_io_stop(loop, &w->accept_io);
				/* A one-shot timer must be set again before each start. */
				ev_timer_set(&w->accept_retry, 0.1, 0.0);
				ev_timer_start(loop, &w->accept_retry);
			}
			return;
		}
		if (w->nconns >= w->cfg->limits.max_connections) {
			sl_conn_refuse(w, fd);
			continue;
		}
		sl_conn_new(w, fd);
	}
}

static void
accept_retry_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct sl_worker *w = t->data;

	if (!w->draining)
		ev_io_start(loop, &w->accept_io);
}

static void
drain_timeout_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct sl_worker *w = t->data;

	sl_warn("drain timeout: cutting %zu connection(s)", w->nconns);
	sl_conn_close_all(w);
	ev_break(loop, EVBREAK_ALL);
}

/* SIGTERM/SIGINT from the master: stop accepting, finish streams, exit. */
/*
 * Stop accepting and let the connections finish. SIGTERM/SIGINT (shutdown)
 * bound the wait by drain_timeout; SIGUSR2 (retired by a reload) does not:
 * a reload must never cut a stream, however long it runs.
 */
static void
sig_drain_cb(struct ev_loop *loop, ev_signal *s, int revents)
{
	struct sl_worker *w = s->data;
	int bounded = s->signum != SIGUSR2;

	if (w->draining) {
		if (bounded && !ev_is_active(&w->drain_timer)) {
			ev_timer_set(&w->drain_timer,
			    (double)w->cfg->drain_timeout_ms / 1000.0, 0.0);
			ev_timer_start(loop, &w->drain_timer);
		}
		return;
	}
	w->draining = 1;
	ev_io_stop(loop, &w->accept_io);
	ev_timer_stop(loop, &w->accept_retry);
	if (w->listen_fd >= 0) {
		/* The master keeps the socket: its queue waits for successors. */
		close(w->listen_fd);
		w->listen_fd = -1;
	}
	sl_conn_drain_all(w);
	if (w->nconns == 0) {
		ev_break(loop, EVBREAK_ALL);
		return;
	}
	sl_info("draining %zu connection(s)%s", w->nconns,
	    bounded ? "" : " (retired by a reload)");
	if (bounded) {
		ev_timer_set(&w->drain_timer,
		    (double)w->cfg->drain_timeout_ms / 1000.0, 0.0);
		ev_timer_start(loop, &w->drain_timer);
	}
}

/* Open (or reopen, on SIGUSR1) the access log; keep the old fd on failure. */
static void
access_log_open(struct sl_worker *w)
{
	const char *dst = w->cfg->access_log;
	int fd;

	if (dst == NULL)
		return;
	if (strcmp(dst, "stderr") == 0) {
		w->access_fd = STDERR_FILENO;
		return;
	}
	fd = open(dst, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
	if (fd == -1) {
		sl_err("access_log %s: %s", dst, strerror(errno));
		return;
	}
	if (w->access_fd > STDERR_FILENO)
		close(w->access_fd);
	w->access_fd = fd;
}

static void
sig_usr1_cb(struct ev_loop *loop, ev_signal *s, int revents)
{
	struct sl_worker *w = s->data;

	access_log_open(w);
}

static void
hup_cb(struct ev_loop *loop, ev_io *io, int revents)
{
	sl_conn_hup_event(io->data);
}

/* Before the loop sleeps: flush what this iteration's events produced. */
static void
flush_cb(struct ev_loop *loop, ev_prepare *p, int revents)
{
	sl_conn_flush_dirty(p->data);
}

static void
gauge_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	sl_conn_gauges(t->data);
	shards_reap(t->data);
}

static void
sig_quit_cb(struct ev_loop *loop, ev_signal *s, int revents)
{
	struct sl_worker *w = s->data;

	sl_conn_close_all(w);
	ev_break(loop, EVBREAK_ALL);
}

int
sl_worker_main(const struct sl_worker_args *a)
{
	struct sl_worker w;
	char role[32];
	sigset_t none;

	memset(&w, 0, sizeof(w));
	snprintf(role, sizeof(role), "worker%d", a->index);
	sl_log_init(a->cfg->log_level, role);

	/* If the master dies, drain and go. */
	prctl(PR_SET_PDEATHSIG, SIGTERM);
	signal(SIGPIPE, SIG_IGN);

	w.loop = ev_default_loop(EVFLAG_AUTO | EVFLAG_NOENV);
	if (w.loop == NULL) {
		sl_err("cannot create the event loop");
		return 1;
	}
	w.cfg = a->cfg;
	w.shm = a->shm;
	w.tenant_slot = a->tenant_slot;
	w.upstream_slot = a->upstream_slot;
	if ((w.pools = sl_pools_new(a->cfg, a->shm, a->row,
	    a->replica_slot)) == NULL) {
		sl_err("cannot set up the upstream pools");
		return 1;
	}
	w.access_fd = -1;
	access_log_open(&w);
	if ((w.keys = sl_keyidx_build(a->cfg)) == NULL) {
		sl_err("cannot build the key index");
		return 1;
	}
	w.row = a->row;
	w.index = a->index;
	w.listen_fd = a->listen_fd;
	TAILQ_INIT(&w.conns);
	TAILQ_INIT(&w.dirty);
	ev_prepare_init(&w.flush_prep, flush_cb);
	w.flush_prep.data = &w;
	w.spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if ((w.hup_fd = epoll_create1(EPOLL_CLOEXEC)) == -1)
		sl_warn("epoll_create1: %s (a client leaving behind unread "
		    "pipelined bytes is noticed at the next write)",
		    strerror(errno));
	w.curl_bufsize = a->cfg->stream_buffer / 2;
	if (w.curl_bufsize > CURL_MAX_WRITE_SIZE)
		w.curl_bufsize = CURL_MAX_WRITE_SIZE;
	if (w.curl_bufsize < 1024)
		w.curl_bufsize = 1024;
	http_parser_set_max_header_size(
	    (uint32_t)a->cfg->limits.max_header_bytes + 1024);

	/*
	 * Every stream the worker may carry, SL_SHARD_STREAMS per shard; the
	 * array never moves (watchers point into it), shards start on demand.
	 */
	w.maxshards = (a->cfg->limits.max_connections + SL_SHARD_STREAMS - 1) /
	    SL_SHARD_STREAMS;
	if ((w.shards = calloc(w.maxshards, sizeof(*w.shards))) == NULL ||
	    (w.nshards = 1, shard_init(&w, &w.shards[0])) == -1) {
		sl_err("cannot create the libcurl multi handle");
		return 1;
	}

	ev_io_init(&w.accept_io, accept_cb, w.listen_fd, EV_READ);
	w.accept_io.data = &w;
	ev_timer_init(&w.accept_retry, accept_retry_cb, 0.1, 0.0);
	w.accept_retry.data = &w;
	ev_init(&w.drain_timer, drain_timeout_cb);
	w.drain_timer.data = &w;
	ev_signal_init(&w.sig_term, sig_drain_cb, SIGTERM);
	ev_signal_init(&w.sig_int, sig_drain_cb, SIGINT);
	ev_signal_init(&w.sig_usr2, sig_drain_cb, SIGUSR2);
	ev_signal_init(&w.sig_quit, sig_quit_cb, SIGQUIT);
	w.sig_term.data = w.sig_int.data = w.sig_quit.data = &w;
	w.sig_usr2.data = &w;
	ev_signal_start(w.loop, &w.sig_usr2);
	ev_signal_start(w.loop, &w.sig_term);
	ev_signal_start(w.loop, &w.sig_int);
	ev_signal_start(w.loop, &w.sig_quit);
	ev_signal_init(&w.sig_usr1, sig_usr1_cb, SIGUSR1);
	w.sig_usr1.data = &w;
	ev_signal_start(w.loop, &w.sig_usr1);
	/* Gauges are published once a second, never per chunk. */
	ev_timer_init(&w.gauge_timer, gauge_cb, 1.0, 1.0);
	w.gauge_timer.data = &w;
	ev_timer_start(w.loop, &w.gauge_timer);
	/* SIGHUP goes to the master; a worker ignores it. */
	signal(SIGHUP, SIG_IGN);

	/*
	 * Signals stayed blocked since fork (inherited from the master): only
	 * now that the watchers exist may they arrive, and any that came in
	 * between are delivered here instead of killing us.
	 */
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);

	/* The master may have died between fork and prctl. */
	if (getppid() == 1)
		return 0;

	ev_prepare_start(w.loop, &w.flush_prep);
	if (w.hup_fd >= 0) {
		ev_io_init(&w.hup_io, hup_cb, w.hup_fd, EV_READ);
		w.hup_io.data = &w;
		ev_io_start(w.loop, &w.hup_io);
	}
	ev_io_start(w.loop, &w.accept_io);
	/*
	 * Ready: the name tells ps(1) and the tests that setup is done (the
	 * master's admin socket was closed before sl_worker_main was called).
	 */
	prctl(PR_SET_NAME, "sluice-worker");
	sl_debug("worker started (row %zu)", w.row);
	ev_run(w.loop, 0);

	sl_conn_close_all(&w);
	sl_conn_gauges(&w);
	while (w.neasy > 0)
		curl_easy_cleanup(w.easy_pool[--w.neasy]);
	for (size_t i = 0; i < w.nshards; i++) {
		if (w.shards[i].multi == NULL)
			continue;
		ev_timer_stop(w.loop, &w.shards[i].timer);
		curl_multi_cleanup(w.shards[i].multi);
	}
	free(w.shards);
	if (w.access_fd > STDERR_FILENO)
		close(w.access_fd);
	sl_keyidx_free(w.keys);
	sl_pools_free(w.pools);
	if (w.spare_fd >= 0)
		close(w.spare_fd);
	if (w.hup_fd >= 0) {
		ev_io_stop(w.loop, &w.hup_io);
		close(w.hup_fd);
	}
	if (w.listen_fd >= 0)
		close(w.listen_fd);
	ev_loop_destroy(w.loop);
	sl_debug("worker exiting");
	return 0;
}
