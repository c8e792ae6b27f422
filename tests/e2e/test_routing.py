# SPDX-License-Identifier: BSD-2-Clause
"""Inference-aware routing (issue 14): runner load signals and prompt-prefix
affinity.

Real processes on 127.0.0.1: sluice, and replicas that are small threaded
HTTP servers (LoadReplica) serving a Prometheus page the test sets, a
/health answer the test sets, and completions that answer with their own
name (or wait until released). What is pinned: the master scrapes each
replica's page and the workers rank by in-flight plus the runner's queue;
a stale sample is ignored; a KV cache over 0.95 is avoided while another
replica can take the request; the gauges; prefix affinity keeps a
conversation on one replica across workers, spills under imbalance, and
forgets a replica that goes down; the config keys and their errors.
"""

import http.server
import json
import threading
import time

import harness as h
from harness import ACME_KEY, UPSTREAM_KEY
from test_pools import pool_config

CT = {"Content-Type": "application/json"}

VLLM_PAGE = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="m"}} {running}
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{model_name="m"}} {waiting}
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{model_name="m"}} {kv}
"""


def vllm_page(waiting=0, running=0, kv=0.0):
    return VLLM_PAGE.format(waiting=waiting, running=running, kv=kv)


class LoadReplica:
    """A replica whose GET /metrics answers `page` (settable; None: 404),
    GET /health answers `health`, and whose POSTs answer 200 with
    {"replica": name}, counting them; a POST with "X-Hold: 1" waits until
    release() (a stream held open). Threaded, loopback, stopped by the test."""

    def __init__(self, name, page=None):
        self.name = name
        self.page = page
        self.health = 200
        self.posts = 0
        self.scrapes = 0
        self.prompts = []
        self._lock = threading.Lock()
        self._release = threading.Event()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _send(self, status, body, ctype="application/json"):
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path == "/metrics":
                    with outer._lock:
                        outer.scrapes += 1
                        page = outer.page
                    if page is None:
                        self._send(404, b'{"error":"no metrics"}')
                    else:
                        self._send(200, page.encode(), "text/plain; version=0.0.4")
                    return
                with outer._lock:
                    st = outer.health
                self._send(st, b'{"status":"%d"}' % st)

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n)
                with outer._lock:
                    outer.posts += 1
                    outer.prompts.append(body)
                if self.headers.get("X-Hold") == "1":
                    outer._release.wait(30)
                self._send(200, json.dumps({"replica": outer.name}).encode())

        self.server = http.server.ThreadingHTTPServer((h.HOST, 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = "http://%s:%d" % (h.HOST, self.port)
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.05}, daemon=True)

    def set_page(self, page):
        with self._lock:
            self.page = page

    def set_health(self, status):
        with self._lock:
            self.health = status

    def release(self):
        self._release.set()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self._release.set()
        self.server.shutdown()
        self.server.server_close()


def chat(gw, messages, headers=None, timeout=20.0):
    """One non-streamed chat completion; returns the replica's name."""
    hd = dict(CT)
    hd.update(headers or {})
    body = json.dumps({"model": "m", "messages": messages}).encode()
    r = gw.request("POST", "/v1/chat/completions", hd, body, key=ACME_KEY,
                   timeout=timeout)
    assert r.status == 200, (r.status, bytes(r.data[:300]))
    return json.loads(bytes(r.data))["replica"]


def held(gw, messages):
    """A request the replica holds open until release(): the client."""
    c = gw.client()
    body = json.dumps({"model": "m", "messages": messages}).encode()
    hd = dict(CT)
    hd.update(h.bearer(ACME_KEY))
    hd["X-Hold"] = "1"
    c.send("POST", "/v1/chat/completions", hd, body)
    return c


LOAD = {"path": "/metrics", "interval": "50ms"}


def wait_scraped(reps, n=2, timeout=5.0):
    start = [r.scrapes for r in reps]
    h.wait_until(lambda: all(r.scrapes >= s + n for r, s in zip(reps, start)),
                 timeout, msg="%d scrapes of every replica" % n)


# ------------------------------------------------------------------ load signal

def test_least_loaded_ranks_by_in_flight_plus_the_runners_queue():
    with LoadReplica("a", vllm_page(waiting=10)) as a, \
            LoadReplica("b", vllm_page(waiting=0)) as b:
        cfg = pool_config([a.url, b.url], load_metrics=LOAD)
        with h.Gateway(cfg) as gw:
            wait_scraped([a, b])
            got = [chat(gw, [{"role": "user", "content": "q%d" % i}]) for i in range(10)]
            assert got == ["b"] * 10, got
            # The queues swap: the next samples send everything to a.
            a.set_page(vllm_page(waiting=0))
            b.set_page(vllm_page(waiting=10))
            wait_scraped([a, b])
            got = [chat(gw, [{"role": "user", "content": "r%d" % i}]) for i in range(10)]
            assert got == ["a"] * 10, got
            m = h.scrape(gw)
            assert m.value("sluice_replica_queue", upstream="main", replica=a.url) == 0
            assert m.value("sluice_replica_queue", upstream="main", replica=b.url) == 10


def test_a_stale_sample_is_ignored_and_the_gauges_go_away():
    with LoadReplica("a", vllm_page(waiting=50, kv=0.25)) as a, \
            LoadReplica("b", vllm_page(waiting=0)) as b:
        cfg = pool_config([a.url, b.url], load_metrics=LOAD)
        with h.Gateway(cfg) as gw:
            wait_scraped([a, b])
            m = h.scrape(gw)
            assert m.value("sluice_replica_queue", upstream="main", replica=a.url) == 50
            assert m.value("sluice_replica_kv_cache", upstream="main", replica=a.url) == 0.25
            assert chat(gw, [{"role": "user", "content": "x"}]) == "b"
            # a's page goes away: after 4 intervals (200 ms) its sample is
            # stale and only in-flight counts rank (both 0: a gets some).
            a.set_page(None)
            h.wait_until(lambda: h.scrape(gw).get("sluice_replica_queue", upstream="main",
                                                  replica=a.url) is None,
                         5, msg="a's queue gauge to go stale")
            got = [chat(gw, [{"role": "user", "content": "y%d" % i}]) for i in range(40)]
            assert got.count("a") > 0 and got.count("b") > 0, got
            assert "no load sample from %s/metrics" % a.url in h.stderr_text(gw)


def test_a_full_kv_cache_is_chosen_only_when_all_are():
    with LoadReplica("a", vllm_page(waiting=0, kv=0.99)) as a, \
            LoadReplica("b", vllm_page(waiting=5, kv=0.5)) as b:
        cfg = pool_config([a.url, b.url], load_metrics=LOAD)
        with h.Gateway(cfg) as gw:
            wait_scraped([a, b])
            # b has a queue but room in its cache; a is idle and full.
            got = [chat(gw, [{"role": "user", "content": "q%d" % i}]) for i in range(8)]
            assert got == ["b"] * 8, got
            b.set_page(vllm_page(waiting=5, kv=0.97))
            wait_scraped([a, b])
            # Both full: the load decides again.
            got = [chat(gw, [{"role": "user", "content": "r%d" % i}]) for i in range(8)]
            assert got == ["a"] * 8, got


def test_tgi_and_llamacpp_pages_are_read():
    tgi = "# TYPE tgi_queue_size gauge\ntgi_queue_size 7\ntgi_batch_current_size 3\n"
    llama = ("# HELP llamacpp:requests_deferred Number of requests deferred.\n"
             "# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 4\n"
             "llamacpp:requests_processing 1\n")
    with LoadReplica("a", tgi) as a, LoadReplica("b", llama) as b:
        cfg = pool_config([a.url, b.url], load_metrics=LOAD)
        with h.Gateway(cfg) as gw:
            wait_scraped([a, b])
            m = h.scrape(gw)
            assert m.value("sluice_replica_queue", upstream="main", replica=a.url) == 7
            assert m.value("sluice_replica_queue", upstream="main", replica=b.url) == 4
            assert m.get("sluice_replica_kv_cache", upstream="main", replica=a.url) is None
            assert chat(gw, [{"role": "user", "content": "x"}]) == "b"


@h.skip_under("valgrind")
def test_hostile_metrics_pages_leave_routing_and_the_master_whole():
    # Pages a broken or hostile runner serves: none of the metrics, bytes
    # that are not text, a page over the 4 MiB bound, values that are not
    # finite or negative. Each replica still takes requests (ranked by
    # sluice's own counts), each failure is logged once with its reason,
    # and the master's descriptors and memory stay put scrape after scrape.
    big = "# HELP other_metric x\n# TYPE other_metric gauge\n" + \
        "other_metric{a=\"b\"} 1\n" * 400000          # about 10 MiB
    pages = ["garbage \x01\x02 {{{ not a page\n" * 100, big,
             "vllm:num_requests_waiting NaN\nvllm:num_requests_waiting -3\n"
             "vllm:kv_cache_usage_perc +Inf\n"]
    reps = [LoadReplica("r%d" % i, pg) for i, pg in enumerate(pages)]
    for r in reps:
        r.__enter__()
    try:
        # 250 ms: a scrape may take 1 s, time enough for 10 MiB on loopback
        # even under the sanitizers.
        cfg = pool_config([r.url for r in reps],
                          load_metrics={"path": "/metrics", "interval": "250ms"})
        with h.Gateway(cfg) as gw:
            wait_scraped(reps, 2)
            fds, rss = h.fd_count(gw.pid), h.rss_kb(gw.pid)
            got = [chat(gw, [{"role": "user", "content": "q%d" % i}]) for i in range(60)]
            assert set(got) == {"r0", "r1", "r2"}, got
            wait_scraped(reps, 8, timeout=15)
            assert h.fd_count(gw.pid) <= fds + 1, (fds, h.fd_count(gw.pid))
            assert h.rss_kb(gw.pid) < rss + 8 * 1024, (rss, h.rss_kb(gw.pid))
            m = h.scrape(gw)
            for r in reps:
                assert m.get("sluice_replica_queue", upstream="main", replica=r.url) is None
            err = h.stderr_text(gw)
            for r, why in zip(reps, ("none of the known metrics on the page",
                                     "the page is larger than 4 MiB",
                                     "none of the known metrics on the page")):
                want = "replica %s: no load sample from %s/metrics: %s" % (r.url, r.url, why)
                assert err.count(want) == 1, (want, err[-2000:])
    finally:
        for r in reps:
            r.__exit__(None, None, None)


def _conns_to(pid, port):
    inodes = h._socket_inodes(pid)
    return [(loc, rem) for loc, rem, _st, ino in h._proc_net_tcp(pid)
            if ino in inodes and rem == (h.HOST, port)]


def test_workers_hold_none_of_the_masters_scrape_connections():
    # The master keeps its scrape connection open between scrapes; a worker
    # forked meanwhile (start, reload, respawn) must not inherit it.
    with LoadReplica("a", vllm_page()) as a:
        cfg = pool_config([a.url], workers=2, load_metrics=LOAD)
        with h.Gateway(cfg, allow_worker_changes=True) as gw:
            wait_scraped([a], 3)
            h.reload(gw)
            wait_scraped([a], 3)
            assert len(_conns_to(gw.pid, a.port)) == 1, _conns_to(gw.pid, a.port)
            workers = gw.worker_pids()
            assert len(workers) == 2
            for w in workers:
                assert _conns_to(w, a.port) == [], (w, _conns_to(w, a.port))


# ------------------------------------------------------------------ affinity

SYSTEM = "You are a careful assistant. " * 12        # 348 bytes: 5 blocks


def conversation(k, turns, shared=False):
    """The message lists of `turns` turns of conversation k, each resending
    the history. Its first block is its own, unless shared: then every such
    conversation starts with the same system prompt (5 blocks)."""
    first = SYSTEM + "conversation %d. " % k if shared else \
        "conversation %d. " % k + SYSTEM
    msgs = [{"role": "system", "content": first}]
    out = []
    for t in range(turns):
        msgs = msgs + [{"role": "user",
                        "content": "turn %d of conversation %d: " % (t, k) + "words " * 20}]
        out.append(list(msgs))
        msgs = msgs + [{"role": "assistant", "content": "answer %d " % t * 10}]
    return out


def test_prefix_affinity_keeps_each_conversation_on_one_replica_across_workers():
    reps = [LoadReplica("r%d" % i) for i in range(4)]
    for r in reps:
        r.__enter__()
    try:
        log = h.tmpfile("access", ".log")
        cfg = pool_config([r.url for r in reps], workers=2, access_log=log,
                          balance="prefix_affinity")
        with h.Gateway(cfg) as gw:
            convs = [conversation(k, 5) for k in range(12)]
            where = {}
            # Turn by turn, each request on a fresh connection (either worker).
            for t in range(5):
                for k, c in enumerate(convs):
                    where.setdefault(k, []).append(chat(gw, c[t]))
            for k, names in where.items():
                assert len(set(names)) == 1, (k, names)
            # New conversations spread over the pool (rendezvous of the
            # first block): 12 of them on at least 2 replicas.
            assert len({names[0] for names in where.values()}) >= 2, where
            lines = h.wait_access_lines(log, 60)
            kinds = [l["affinity"] for l in lines]
            assert kinds.count("hit") + kinds.count("miss") == 60, kinds
            assert kinds.count("spill") == 0, kinds
            m = h.scrape(gw)
            hits = m.value("sluice_affinity_hits_total", upstream="main")
            misses = m.value("sluice_affinity_misses_total", upstream="main")
            assert hits + misses == 60 and hits == kinds.count("hit"), (hits, misses)
            # Every first turn is a miss on its worker; later turns hit on
            # the worker that saw an earlier one (at most 2 misses each).
            assert 12 <= misses <= 24, misses
    finally:
        for r in reps:
            r.__exit__(None, None, None)


def test_every_turn_after_the_first_finds_its_replica_whichever_worker_routed_the_last():
    reps = [LoadReplica("r%d" % i) for i in range(4)]
    for r in reps:
        r.__enter__()
    try:
        log = h.tmpfile("access", ".log")
        cfg = pool_config([r.url for r in reps], workers=2, access_log=log,
                          balance="prefix_affinity")
        with h.Gateway(cfg) as gw:
            convs = [conversation(40 + k, 4) for k in range(12)]
            where = {}
            for t in range(4):
                for k, c in enumerate(convs):
                    where.setdefault(k, []).append(chat(gw, c[t]))
            for k, names in where.items():
                assert len(set(names)) == 1, (k, names)
            # The workers share where they sent each prefix (hints in the
            # shared region): only first turns miss. With a table per
            # worker alone, a turn whose earlier turns all went through the
            # other worker missed too (about 10 more of 48 here).
            kinds = [l["affinity"] for l in h.wait_access_lines(log, 48)]
            assert kinds.count("miss") == 12 and kinds.count("hit") == 36, kinds
    finally:
        for r in reps:
            r.__exit__(None, None, None)


def test_conversations_sharing_a_system_prompt_follow_it_on_an_idle_pool():
    reps = [LoadReplica("r%d" % i) for i in range(4)]
    for r in reps:
        r.__enter__()
    try:
        log = h.tmpfile("access", ".log")
        cfg = pool_config([r.url for r in reps], access_log=log,
                          balance="prefix_affinity")
        with h.Gateway(cfg) as gw:
            names = [chat(gw, conversation(k, 1, shared=True)[0]) for k in range(8)]
            # The shared 5 blocks are cached where the first one went.
            assert len(set(names)) == 1, names
            kinds = [l["affinity"] for l in h.wait_access_lines(log, 8)]
            assert kinds == ["miss"] + ["hit"] * 7, kinds
    finally:
        for r in reps:
            r.__exit__(None, None, None)


def test_a_new_prompt_goes_to_the_same_replica_from_two_gateways():
    reps = [LoadReplica("r%d" % i) for i in range(4)]
    for r in reps:
        r.__enter__()
    try:
        cfgs = [pool_config([r.url for r in reps], balance="prefix_affinity")
                for _ in range(2)]
        with h.Gateway(cfgs[0]) as g1, h.Gateway(cfgs[1]) as g2:
            for k in range(10):
                msgs = conversation(100 + k, 1)[0]
                assert chat(g1, msgs) == chat(g2, msgs), k
    finally:
        for r in reps:
            r.__exit__(None, None, None)


def test_affinity_spills_under_imbalance_and_comes_back():
    with LoadReplica("a") as a, LoadReplica("b") as b:
        log = h.tmpfile("access", ".log")
        cfg = pool_config([a.url, b.url], access_log=log, balance="prefix_affinity",
                          affinity={"block": 64, "max_imbalance": 1.5})
        with h.Gateway(cfg) as gw:
            conv = conversation(7, 3)
            home = chat(gw, conv[0])
            other = "b" if home == "a" else "a"
            rep = a if home == "a" else b
            # Two streams held open on the home replica: the first turn
            # again, a hit each time (0 vs 0, then 1 vs 0: not over).
            holders = [held(gw, conv[0])]
            h.wait_metric(gw, "sluice_replica_streams", 1, upstream="main", replica=rep.url)
            holders.append(held(gw, conv[0]))
            h.wait_metric(gw, "sluice_replica_streams", 2, upstream="main", replica=rep.url)
            # Load 2 vs 0: over 1.5 x 0 and over it by 2: spill.
            assert chat(gw, conv[1]) == other
            rep.release()
            for c in holders:
                r = c.read_response(timeout=10)
                assert r.status == 200
                c.close()
            h.wait_metric(gw, "sluice_replica_streams", 0, upstream="main", replica=rep.url)
            # The spill moved the conversation: its history now lives on
            # `other`, and the next turn stays there.
            assert chat(gw, conv[2]) == other
            kinds = [l["affinity"] for l in h.wait_access_lines(log, 5)]
            # first turn, the two held (ended last), the spill, the last turn
            assert sorted(kinds) == ["hit", "hit", "hit", "miss", "spill"], kinds
            assert kinds[0] == "miss" and kinds[1] == "spill", kinds
            m = h.scrape(gw)
            assert m.value("sluice_affinity_spills_total", upstream="main") == 1


def test_a_new_conversation_follows_a_shared_system_prompt_only_to_a_least_loaded_holder():
    with LoadReplica("a") as a, LoadReplica("b") as b:
        log = h.tmpfile("access", ".log")
        cfg = pool_config([a.url, b.url], access_log=log, balance="prefix_affinity")
        with h.Gateway(cfg) as gw:
            conv = conversation(21, 2, shared=True)
            home = chat(gw, conv[0])
            rep, other = (a, "b") if home == "a" else (b, "a")
            c = held(gw, conv[0])
            h.wait_metric(gw, "sluice_replica_streams", 1, upstream="main", replica=rep.url)
            # 1 vs 0: not over the imbalance bound, so the conversation's own
            # next turn stays home; but a new conversation whose only known
            # prefix is the shared system prompt goes to the least loaded.
            assert chat(gw, conversation(22, 1, shared=True)[0]) == other
            assert chat(gw, conv[1]) == home
            rep.release()
            assert c.read_response(timeout=10).status == 200
            c.close()
            h.wait_metric(gw, "sluice_replica_streams", 0, upstream="main", replica=rep.url)
            # Idle again: the next new one follows the system prompt home.
            assert chat(gw, conversation(23, 1, shared=True)[0]) == home
            kinds = [l["affinity"] for l in h.wait_access_lines(log, 5)]
            # first turn, the new one (miss), next turn, the held one, the last new
            assert kinds == ["miss", "miss", "hit", "hit", "hit"], kinds


def test_affinity_with_load_metrics_counts_the_runners_own_queue_once():
    with LoadReplica("a") as a, LoadReplica("b") as b:
        log = h.tmpfile("access", ".log")
        cfg = pool_config([a.url, b.url], access_log=log, balance="prefix_affinity",
                          load_metrics=LOAD)
        with h.Gateway(cfg) as gw:
            conv = conversation(31, 2)
            home = chat(gw, conv[0])
            rep, orep = (a, b) if home == "a" else (b, a)
            holders = [held(gw, conv[0])]
            h.wait_metric(gw, "sluice_replica_streams", 1, upstream="main", replica=rep.url)
            holders.append(held(gw, conv[0]))
            h.wait_metric(gw, "sluice_replica_streams", 2, upstream="main", replica=rep.url)
            holders.append(held(gw, []))          # no prompt: least loaded, the other
            h.wait_metric(gw, "sluice_replica_streams", 1, upstream="main", replica=orep.url)
            # The home runner queues one of this node's two streams, the other
            # runs this node's one: loads 2 and 1, not 3 and 1 (which would be
            # over 1.5 x 1 and by 2: a spill paying the whole prefill elsewhere).
            rep.set_page(vllm_page(running=1, waiting=1))
            orep.set_page(vllm_page(running=1, waiting=0))
            wait_scraped([a, b])
            assert chat(gw, conv[1]) == home
            # Another node's requests the runner holds do count: 4 + 0 vs 1.
            rep.set_page(vllm_page(running=3, waiting=1))
            wait_scraped([a, b])
            assert chat(gw, conv[1]) != home
            a.release()
            b.release()
            for c in holders:
                assert c.read_response(timeout=10).status == 200
                c.close()


def test_affinity_with_load_metrics_places_new_prompts_away_from_a_runners_queue():
    with LoadReplica("a") as a, LoadReplica("b") as b:
        cfg = pool_config([a.url, b.url], balance="prefix_affinity", load_metrics=LOAD)
        with h.Gateway(cfg) as gw:
            holders = [held(gw, []), held(gw, [])]     # no prompt: one on each
            h.wait_metric(gw, "sluice_replica_streams", 1, upstream="main", replica=a.url)
            h.wait_metric(gw, "sluice_replica_streams", 1, upstream="main", replica=b.url)
            # One stream each, but a's runner queues it: a new prompt goes to b
            # (least_loaded's rank, in-flight + queue), not to a tie.
            a.set_page(vllm_page(running=0, waiting=1))
            b.set_page(vllm_page(running=1, waiting=0))
            wait_scraped([a, b])
            got = [chat(gw, conversation(500 + k, 1)[0]) for k in range(8)]
            assert got == ["b"] * 8, got
            a.release()
            b.release()
            for c in holders:
                assert c.read_response(timeout=10).status == 200
                c.close()


def test_one_stream_more_on_the_home_replica_does_not_spill():
    with LoadReplica("a") as a, LoadReplica("b") as b:
        cfg = pool_config([a.url, b.url], balance="prefix_affinity")
        with h.Gateway(cfg) as gw:
            conv = conversation(9, 2)
            home = chat(gw, conv[0])
            rep = a if home == "a" else b
            c = held(gw, conv[0])
            h.wait_metric(gw, "sluice_replica_streams", 1, upstream="main", replica=rep.url)
            # 1 vs 0 is over 1.5 x 0 but not by 2: an idle pool keeps affinity.
            assert chat(gw, conv[1]) == home
            rep.release()
            assert c.read_response(timeout=10).status == 200
            c.close()


def test_new_prompts_under_load_go_to_the_least_loaded():
    with LoadReplica("a") as a, LoadReplica("b") as b:
        log = h.tmpfile("access", ".log")
        cfg = pool_config([a.url, b.url], access_log=log, balance="prefix_affinity")
        with h.Gateway(cfg) as gw:
            conv = conversation(11, 1)
            home = chat(gw, conv[0])
            rep, other = (a, "b") if home == "a" else (b, "a")
            c = held(gw, conv[0])
            h.wait_metric(gw, "sluice_replica_streams", 1, upstream="main", replica=rep.url)
            # 1 vs 0: every prompt nobody has seen goes to the idle one,
            # whatever its first block's rendezvous choice would be.
            got = [chat(gw, conversation(3000 + k, 1)[0]) for k in range(8)]
            assert got == [other] * 8, got
            rep.release()
            assert c.read_response(timeout=10).status == 200
            c.close()
            kinds = [l["affinity"] for l in h.wait_access_lines(log, 10)]
            assert kinds.count("miss") == 9 and kinds.count("hit") == 1, kinds


def test_a_holder_that_is_down_makes_a_spill_and_is_forgotten_when_back():
    # Issue 22: a holder that went down was forgotten at once, so the next
    # turn counted a miss; sluice.8 says a holder down is a spill.
    with LoadReplica("a") as a, LoadReplica("b") as b:
        log = h.tmpfile("access", ".log")
        cfg = pool_config([a.url, b.url], access_log=log, balance="prefix_affinity",
                          health={"path": "/health", "interval": "100ms",
                                  "timeout": "80ms", "fall": 1, "rise": 1})
        with h.Gateway(cfg) as gw:
            conv = conversation(3, 5)
            home = chat(gw, conv[0])
            rep, other = (a, "b") if home == "a" else (b, "a")
            assert chat(gw, conv[1]) == home
            rep.set_health(500)
            h.wait_metric(gw, "sluice_replica_up", 0, upstream="main", replica=rep.url)
            # Its holder is down: a spill elsewhere, and the conversation moves.
            assert chat(gw, conv[2]) == other
            assert chat(gw, conv[3]) == other
            rep.set_health(200)
            h.wait_metric(gw, "sluice_replica_up", 1, upstream="main", replica=rep.url)
            # Its history is now on `other`: it stays there.
            assert chat(gw, conv[4]) == other
            kinds = [l["affinity"] for l in h.wait_access_lines(log, 5)]
            assert kinds == ["miss", "hit", "spill", "hit", "hit"], kinds
            m = h.scrape(gw)
            assert (m.value("sluice_affinity_hits_total", upstream="main"),
                    m.value("sluice_affinity_misses_total", upstream="main"),
                    m.value("sluice_affinity_spills_total", upstream="main")) == (3, 1, 1)


def test_a_replica_back_up_after_being_down_loses_its_affinity_entries():
    # A conversation whose holder went down and came back before its next
    # turn: the runner restarted (its cache is gone), the turn is a miss.
    with LoadReplica("a") as a, LoadReplica("b") as b:
        log = h.tmpfile("access", ".log")
        cfg = pool_config([a.url, b.url], access_log=log, balance="prefix_affinity",
                          health={"path": "/health", "interval": "100ms",
                                  "timeout": "80ms", "fall": 1, "rise": 1})
        with h.Gateway(cfg) as gw:
            conv = conversation(3, 3)
            home = chat(gw, conv[0])
            rep = a if home == "a" else b
            assert chat(gw, conv[1]) == home
            rep.set_health(500)
            h.wait_metric(gw, "sluice_replica_up", 0, upstream="main", replica=rep.url)
            # The worker sees it down (on another conversation's request).
            chat(gw, [{"role": "user", "content": "another conversation " * 8}])
            rep.set_health(200)
            h.wait_metric(gw, "sluice_replica_up", 1, upstream="main", replica=rep.url)
            chat(gw, conv[2])
            kinds = [l["affinity"] for l in h.wait_access_lines(log, 4)]
            assert kinds == ["miss", "hit", "miss", "miss"], kinds


def test_prefix_affinity_places_new_conversations_by_weight():
    with LoadReplica("a") as a, LoadReplica("b") as b:
        cfg = pool_config([{"url": a.url, "weight": 3}, {"url": b.url, "weight": 1}],
                          balance="prefix_affinity")
        with h.Gateway(cfg) as gw:
            got = [chat(gw, [{"role": "user", "content": "new conversation %d " % i * 8}])
                   for i in range(200)]
            # 150 / 50 expected; a binomial spread of 3 sigma is about 18
            assert 125 <= got.count("a") <= 175, (got.count("a"), got.count("b"))


def test_requests_without_a_prompt_are_chosen_as_least_loaded():
    with LoadReplica("a") as a, LoadReplica("b") as b:
        log = h.tmpfile("access", ".log")
        cfg = pool_config([a.url, b.url], access_log=log, balance="prefix_affinity")
        with h.Gateway(cfg) as gw:
            for body in (b"not json", b'{"model":"m"}', b"[1,2]"):
                r = gw.request("POST", "/v1/chat/completions", CT, body, key=ACME_KEY)
                assert r.status == 200
            kinds = [l["affinity"] for l in h.wait_access_lines(log, 3)]
            assert kinds == ["-", "-", "-"], kinds
            m = h.scrape(gw)
            assert m.value("sluice_affinity_misses_total", upstream="main") == 0
            assert m.value("sluice_affinity_hits_total", upstream="main") == 0


# ------------------------------------------------------------------ config

POOL = """listen: "127.0.0.1:{port}"
upstreams:
  llama:
    replicas:
      - url: "http://127.0.0.1:9001"
      - url: "http://127.0.0.1:9002"
{extra}
tenants:
  acme:
    keys: ["k"]
    max_streams: 2
"""


def check(extra):
    text = POOL.format(port=h.free_port(), extra=extra)
    path = h.write_config(text)
    rc, out, err = h.run_sluice(["-t", "-c", path])
    return path, text, rc, out, err


def test_check_accepts_the_routing_keys():
    path, _, rc, out, err = check(
        "    balance: prefix_affinity\n"
        "    affinity: {block: 128, max_imbalance: 2.25}\n"
        "    load_metrics: {path: /metrics, interval: 50ms}")
    assert (rc, out, err) == (0, "%s: ok\n" % path, ""), (rc, out, err)


def test_check_rejects_bad_routing_values_at_their_place():
    cases = [
        ("    balance: prefix", "prefix",
         "upstreams.llama.balance: 'prefix' must be one of least_loaded, "
         "round_robin, random, prefix_affinity"),
        ("    affinity: {max_imbalance: 0.5}", "0.5",
         "upstreams.llama.affinity.max_imbalance: 0.5 is out of range 1.0-100"),
        ("    affinity: {max_imbalance: 1.505}", "1.505",
         "upstreams.llama.affinity.max_imbalance: '1.505' is not a decimal number "
         "(e.g. 1.5, at most 2 decimals)"),
        ("    affinity: {block: 8}", "8",
         "upstreams.llama.affinity.block: 8 is out of range 16-65536"),
        ("    load_metrics: {interval: 10ms}", "10ms",
         "upstreams.llama.load_metrics.interval: 10ms is out of range 50ms-1h"),
        ("    load_metrics: {path: metrics}", "metrics}",
         "upstreams.llama.load_metrics.path: 'metrics' must start with '/' and "
         "hold no spaces or control characters"),
        ("    load_metrics: {every: 1s}", "every",
         "unknown key 'every' in upstreams.llama.load_metrics"),
    ]
    for extra, at, msg in cases:
        path, text, rc, out, err = check(extra)
        i = text.index(extra) + extra.index(at)
        line = text.count("\n", 0, i) + 1
        col = i - (text.rfind("\n", 0, i) + 1) + 1
        assert rc == 1, (extra, rc, out, err)
        assert err.splitlines() == ["%s:%d:%d: %s" % (path, line, col, msg)], (extra, err)
