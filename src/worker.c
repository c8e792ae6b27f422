/* SPDX-License-Identifier: BSD-2-Clause */
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

#include "sl_h2.h"
#include "sl_log.h"
#include "sl_exchange.h"
#include "sl_h1.h"
#include "sl_worker.h"

/* The least a new worker waits for Redis before it accepts anyway. */
#define ACCEPT_AWAIT_MIN_S 1.0

#define ACCEPTS_PER_EVENT 64

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
						sl_h1_refuse(w, fd);
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
		if (w->nconns >= w->cfg->limits.max_connections &&
		    !sl_h1_reap_idle(w)) {
			sl_h1_refuse(w, fd);
			continue;
		}
		sl_h1_new(w, fd);
	}
}

static void
accept_retry_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct sl_worker *w = t->data;

	(void)revents;
	if (w->accept_await) {
		/* cluster.timeout without an answer from Redis: accept anyway. */
		w->accept_await = 0;
		sl_cluster_worker_await_end(w->cluster);
	}
	if (!w->draining)
		ev_io_start(loop, &w->accept_io);
}

/* The worker's Redis connection answered: accept (sl_cluster_worker_await). */
static void
accept_ready(void *arg)
{
	struct sl_worker *w = arg;

	w->accept_await = 0;
	ev_timer_stop(w->loop, &w->accept_retry);
	if (!w->draining)
		ev_io_start(w->loop, &w->accept_io);
}

static void
drain_timeout_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct sl_worker *w = t->data;

	sl_warn("drain timeout: cutting %zu connection(s)", w->nconns);
	sl_h2_close_all(w);
	sl_conn_close_all(w);
	sl_h1_close_all(w);
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
	if (w->accept_await) {
		w->accept_await = 0;
		(void)sl_cluster_worker_await(w->cluster, NULL, NULL);
	}
	if (w->listen_fd >= 0) {
		/* The master keeps the socket: its queue waits for successors. */
		close(w->listen_fd);
		w->listen_fd = -1;
	}
	sl_h1_drain_all(w);
	sl_h2_drain_all(w);
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
	sl_h1_hup_event(io->data);
}

/* Before the loop sleeps: flush what this iteration's events produced. */
static void
flush_cb(struct ev_loop *loop, ev_prepare *p, int revents)
{
	sl_conn_flush_dirty(p->data);
}

static void
queue_cb(struct ev_loop *loop, ev_io *io, int revents)
{
	sl_conn_queue_event(io->data);
}

/* The connection gauges, HTTP/2's apart (the exchange cannot see them). */
static void
h2_gauges(struct sl_worker *w)
{
	uint64_t conns, streams;

	sl_conn_gauges(w);
	sl_h2_counts(w, &conns, &streams);
	sl_shm_stat_set(w->shm, w->row, SL_STAT_H2_CONNECTIONS, conns);
	sl_shm_stat_set(w->shm, w->row, SL_STAT_H2_STREAMS, streams);
}

static void
gauge_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct sl_worker *w = t->data;
	size_t u;

	h2_gauges(w);
	sl_transfers_reap(w->xfers);
	/*
	 * A slot no release handed over (a replica back up, a cap a reload
	 * raised, one a worker of an older generation gave back) goes to
	 * the queues' waiters within a second.
	 */
	for (u = 0; w->queue != NULL && u < w->cfg->nupstreams; u++)
		sl_pool_pump(w->pools, u);
	sl_conn_queue_tick(w);
}

static void
sig_quit_cb(struct ev_loop *loop, ev_signal *s, int revents)
{
	struct sl_worker *w = s->data;

	sl_h2_close_all(w);
	sl_conn_close_all(w);
	sl_h1_close_all(w);
	ev_break(loop, EVBREAK_ALL);
}

/*
 * The worker's state from its arguments: the loop, the pools, the models,
 * the access log, the lists, the flush watcher and the spare fd. -1
 * (logged) when one cannot be made.
 */
static int
worker_init(struct sl_worker *w, const struct sl_worker_args *a)
{
	w->loop = ev_default_loop(EVFLAG_AUTO | EVFLAG_NOENV);
	if (w->loop == NULL) {
		sl_err("cannot create the event loop");
		return -1;
	}
	w->cfg = a->cfg;
	w->shm = a->shm;
	w->tenant_slot = a->tenant_slot;
	w->index_epoch = a->replica_epoch;
	w->upstream_slot = a->upstream_slot;
	w->queue_slot = a->queue_slot;
	w->model_slot = a->model_slot;
	if ((w->pools = sl_pools_new(a->cfg, a->shm, a->row,
	    a->replica_slot, a->replica_epoch)) == NULL) {
		sl_err("cannot set up the upstream pools");
		return -1;
	}
	w->queue = a->queue;
	w->stored = a->stored;
	TAILQ_INIT(&w->queued);
	if (w->queue != NULL)
		sl_pools_set_queue(w->pools, w->queue, a->queue_slot);
	if (a->cfg->models != NULL && (w->models = sl_models_new(a->cfg)) == NULL) {
		sl_err("cannot set up the models' targets");
		return -1;
	}
	w->access_fd = -1;
	access_log_open(w);
	w->keys = a->keys;
	w->row = a->row;
	w->index = a->index;
	w->listen_fd = a->listen_fd;
	TAILQ_INIT(&w->conns);
	TAILQ_INIT(&w->h1s);
	TAILQ_INIT(&w->h2s);
	TAILQ_INIT(&w->dirty);
	TAILQ_INIT(&w->idle);
	ev_prepare_init(&w->flush_prep, flush_cb);
	w->flush_prep.data = w;
	w->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	return 0;
}

/*
 * What the bytes go through: the block cache, the epoll set of stopped
 * client sockets, http-parser's header limit, the libcurl multi handle
 * and the cluster connection. -1 (logged) when one cannot be made.
 */
static int
worker_init_transport(struct sl_worker *w, const struct sl_worker_args *a)
{
	const struct sl_transfer_hooks hooks = {
		sl_conn_upstream_done, sl_conn_flush_dirty_hook, w
	};

	/* Idle blocks kept for reuse: at most 4 MiB per worker. */
	if (sl_blocks_init(&w->blocks, 1024) == -1) {
		sl_err("out of memory");
		return -1;
	}
	if ((w->hup_fd = epoll_create1(EPOLL_CLOEXEC)) == -1)
		sl_warn("epoll_create1: %s (a client leaving behind unread "
		    "pipelined bytes is noticed at the next write)",
		    strerror(errno));
	http_parser_set_max_header_size(
	    (uint32_t)a->cfg->limits.max_header_bytes + 1024);
	if ((w->xfers = sl_transfers_new(w->loop, a->cfg, &hooks)) == NULL) {
		sl_err("cannot create the libcurl multi handle");
		return -1;
	}
	if (a->cfg->cluster.enabled && a->cluster_shm != NULL &&
	    (w->cluster = sl_cluster_worker_new(w->loop, a->cfg, a->shm,
	    a->cluster_shm, a->row, a->tenant_slot)) == NULL) {
		sl_err("cannot set up the cluster connection");
		return -1;
	}
	return 0;
}

/*
 * The watchers made, not started save the signals' and the gauge timer:
 * accept, its retry timer, the drain timer, SIGTERM, SIGINT, SIGUSR2
 * (drain), SIGQUIT (cut), SIGUSR1 (reopen the access log), the gauges
 * once a second; SIGHUP ignored.
 */
static void
worker_watchers_init(struct sl_worker *w)
{
	ev_io_init(&w->accept_io, accept_cb, w->listen_fd, EV_READ);
	w->accept_io.data = w;
	ev_timer_init(&w->accept_retry, accept_retry_cb, 0.1, 0.0);
	w->accept_retry.data = w;
	ev_init(&w->drain_timer, drain_timeout_cb);
	w->drain_timer.data = w;
	ev_signal_init(&w->sig_term, sig_drain_cb, SIGTERM);
	ev_signal_init(&w->sig_int, sig_drain_cb, SIGINT);
	ev_signal_init(&w->sig_usr2, sig_drain_cb, SIGUSR2);
	ev_signal_init(&w->sig_quit, sig_quit_cb, SIGQUIT);
	w->sig_term.data = w->sig_int.data = w->sig_quit.data = w;
	w->sig_usr2.data = w;
	ev_signal_start(w->loop, &w->sig_usr2);
	ev_signal_start(w->loop, &w->sig_term);
	ev_signal_start(w->loop, &w->sig_int);
	ev_signal_start(w->loop, &w->sig_quit);
	ev_signal_init(&w->sig_usr1, sig_usr1_cb, SIGUSR1);
	w->sig_usr1.data = w;
	ev_signal_start(w->loop, &w->sig_usr1);
	/* Gauges are published once a second, never per chunk. */
	ev_timer_init(&w->gauge_timer, gauge_cb, 1.0, 1.0);
	w->gauge_timer.data = w;
	ev_timer_start(w->loop, &w->gauge_timer);
	/* SIGHUP goes to the master; a worker ignores it. */
	signal(SIGHUP, SIG_IGN);
}

/*
 * Start the rest: the flush before each sleep, the epoll set of stopped
 * sockets, then accepting (or, in a cluster whose Redis has not answered
 * yet, the timer that starts accepting anyway), and the queue's eventfd.
 */
static void
worker_start(struct sl_worker *w, const struct sl_worker_args *a)
{
	ev_prepare_start(w->loop, &w->flush_prep);
	if (w->hup_fd >= 0) {
		ev_io_init(&w->hup_io, hup_cb, w->hup_fd, EV_READ);
		w->hup_io.data = w;
		ev_io_start(w->loop, &w->hup_io);
	}
	if (w->cluster != NULL && !sl_cluster_worker_await(w->cluster,
	    accept_ready, w)) {
		/*
		 * Redis is up (the node's mode says so): its first answer
		 * is due in a round trip. A slow start (a loaded machine)
		 * may take longer than an admission may wait, and not
		 * accepting meanwhile costs nothing but that wait, where
		 * accepting would admit by on_redis_down: at least a second.
		 */
		double wait = (double)a->cfg->cluster.timeout_ms / 1000.0;

		w->accept_await = 1;
		ev_timer_set(&w->accept_retry, wait > ACCEPT_AWAIT_MIN_S ? wait :
		    ACCEPT_AWAIT_MIN_S, 0.0);
		ev_timer_start(w->loop, &w->accept_retry);
	} else
		ev_io_start(w->loop, &w->accept_io);
	if (w->queue != NULL && sl_queue_wake_fd(w->queue, a->row) >= 0) {
		ev_io_init(&w->queue_io, queue_cb, sl_queue_wake_fd(w->queue,
		    a->row), EV_READ);
		w->queue_io.data = w;
		ev_io_start(w->loop, &w->queue_io);
	}
}

/*
 * After the loop: cut what is left, publish the last gauges, give back
 * the cluster's leases after the last release, free and close the rest.
 */
static void
worker_teardown(struct sl_worker *w)
{
	sl_h2_close_all(w);
	sl_conn_close_all(w);
	sl_h1_close_all(w);
	if (w->queue != NULL)
		ev_io_stop(w->loop, &w->queue_io);
	h2_gauges(w);
	sl_cluster_worker_free(w->cluster);   /* after the last release */
	sl_transfers_free(w->xfers);
	sl_blocks_free(&w->blocks);
	if (w->access_fd > STDERR_FILENO)
		close(w->access_fd);
	sl_pools_free(w->pools);
	sl_models_free(w->models);
	if (w->spare_fd >= 0)
		close(w->spare_fd);
	if (w->hup_fd >= 0) {
		ev_io_stop(w->loop, &w->hup_io);
		close(w->hup_fd);
	}
	if (w->listen_fd >= 0)
		close(w->listen_fd);
	ev_loop_destroy(w->loop);
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

	if (worker_init(&w, a) == -1 || worker_init_transport(&w, a) == -1)
		return 1;
	worker_watchers_init(&w);

	/*
	 * Signals stayed blocked since fork (inherited from the master): only
	 * now that the watchers exist may they arrive, and any that came in
	 * between are delivered here instead of killing us.
	 */
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);

	/*
	 * The master may have died between fork and prctl: then the parent
	 * is whoever reaps orphans, not always init (a subreaper, a
	 * container's first process).
	 */
	if (getppid() != a->master_pid)
		return 0;

	worker_start(&w, a);
	/*
	 * Ready: the name tells ps(1) and the tests that setup is done (the
	 * master's admin socket was closed before sl_worker_main was called).
	 */
	prctl(PR_SET_NAME, "sluice-worker");
	sl_debug("worker started (row %zu)", w.row);
	ev_run(w.loop, 0);

	worker_teardown(&w);
	sl_debug("worker exiting");
	return 0;
}
