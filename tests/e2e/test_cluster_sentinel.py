# SPDX-License-Identifier: BSD-2-Clause
"""cluster.sentinels: the nodes find the Redis master through Redis Sentinel
and follow a failover (issue 36; sluice.8 CLUSTER). A real topology on
127.0.0.1: a master, a replica (--replicaof), three redis-sentinel, two
sluice nodes and the stub; every process started and ended by pid."""

import json
import re
import socket
import threading
import time

import harness as h
from harness import ACME_KEY, Gateway, Redis, Sentinel, Stub, _resp_encode, _RespReader

MAX = 6
HEARTBEAT = 0.5
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 4000
LONG = dict(events=100000, interval=200)    # a stream that lasts until cut


def sentinel_gw(stub, sentinels, node, on_redis_down="local_share", workers=2,
                allow_worker_changes=False, **over):
    cfg = h.gateway_config(
        stub, workers=workers, log_level="info",
        admin_listen="%s:%d" % (h.HOST, h.free_port()),
        tenants={"acme": {"max_streams": MAX, "retry_after": 2}},
        cluster={"sentinels": [s.addr for s in sentinels], "master_name": "sluice",
                 "node": node, "lease_ttl": "4s", "heartbeat": "%dms" % (HEARTBEAT * 1000),
                 "timeout": "200ms", "on_redis_down": on_redis_down})
    cfg = h.deep_merge(cfg, over)
    return Gateway(cfg, name=node, allow_worker_changes=allow_worker_changes)


def healthz(gw):
    """(mode, master address) from /healthz."""
    r = h.admin_request(h.admin_port(gw), "GET", "/healthz")
    assert r.status == 200, (r.status, r.text)
    m = re.fullmatch(r"ok\ncluster: (\S+)\ncluster master: (\S+)\n", r.text)
    assert m, "healthz body %r" % r.text
    return m.group(1), m.group(2)


def wait_follow(gw, addr, timeout):
    """Wait until gw admits through Redis at addr; the time it took."""
    t0 = time.monotonic()
    h.wait_until(lambda: healthz(gw) == ("redis", addr), timeout, interval=0.05,
                 msg="%s to admit through Redis at %s (now %r)" % (gw.name, addr, healthz(gw)))
    return time.monotonic() - t0


def wait_master_seen(gw, addr, timeout):
    h.wait_until(lambda: healthz(gw)[1] == addr, timeout, interval=0.02,
                 msg="%s to name master %s (now %r)" % (gw.name, addr, healthz(gw)))


def try_stream(gw):
    c, r = gw.open_stream(key=ACME_KEY, tag="acme", **LONG)
    if r.status != 200:
        r.read_all(timeout=5)
        c.close()
    return c, r


def hold(gw, n):
    held = []
    for i in range(n):
        c, r = try_stream(gw)
        assert r.status == 200, "stream %d of %d on %s: %d %r" % (
            i + 1, n, gw.name, r.status, bytes(r.data[:200]))
        held.append(c)
    return held


def role(redis):
    return redis.command("ROLE")[0]


def topology():
    """A master, its replica and three sentinels that see both and each
    other: (master, replica, sentinels), started."""
    master = Redis(name="redis-master").start()
    replica = Redis(name="redis-replica",
                    args=["--replicaof", h.HOST, master.port]).start()
    h.wait_until(lambda: "master_link_status:up" in replica.command("INFO", "replication"),
                 10, interval=0.05, msg="the replica to sync")
    sentinels = [Sentinel(master, down_after_ms=DOWN_AFTER_MS,
                          failover_timeout_ms=FAILOVER_TIMEOUT_MS).start() for _ in range(3)]
    for s in sentinels:
        h.wait_until(lambda: len(s.command("SENTINEL", "replicas", "sluice")) == 1 and
                     len(s.command("SENTINEL", "sentinels", "sluice")) == 2, 20,
                     interval=0.1, msg="sentinel %s to see the replica and 2 sentinels" % s.addr)
    return master, replica, sentinels


def stop_all(procs):
    for p in procs:
        if p is not None:
            p.kill()


def sluice_clients(redis):
    """Clients of redis that are not sentinels, its replication link or
    this probe: a sluice node's connection."""
    out = []
    for line in redis.command("CLIENT", "LIST").splitlines():
        f = dict(kv.split("=", 1) for kv in line.split(" ") if "=" in kv)
        if f.get("name", "").startswith("sentinel-") or "M" in f.get("flags", "") \
                or "S" in f.get("flags", "") or f.get("cmd") == "client|list":
            continue
        out.append(line)
    return out


def failover_case(how):
    """Two nodes at max_streams 6 hold 3 streams each; the master dies
    (SIGKILL), stalls (SIGSTOP) or dies with the first sentinel killed
    too. Both follow the promoted replica, the runner never has more than
    6 streams, 2 more requests on each node are refused once both admit
    through Redis again, and the old master, back, is demoted and unused."""
    master = replica = None
    sentinels = []
    with Stub() as stub:
        try:
            master, replica, sentinels = topology()
            a = sentinel_gw(stub, sentinels, "gw-a")
            b = sentinel_gw(stub, sentinels, "gw-b")
            with a, b:
                for gw in (a, b):
                    wait_follow(gw, master.addr, 10)
                h.wait_metric(a, "sluice_cluster_nodes", 2, timeout=5)
                h.wait_metric(b, "sluice_cluster_nodes", 2, timeout=5)
                held = hold(a, 3) + hold(b, 3)
                h.wait_until(lambda: master.leases("acme") == 6, 5,
                             msg="6 leases on the master")
                h.wait_until(lambda: replica.leases("acme") == 6, 5,
                             msg="6 leases replicated")
                if how == "sentinel_killed":
                    sentinels[0].kill()
                t0 = time.monotonic()
                if how == "stop":
                    master.freeze()
                else:
                    master.kill()
                live = [s for s in sentinels if s.running()]
                # The sentinels' own failover, as they answer it.
                h.wait_until(lambda: all(s.master_addr() == replica.addr for s in live),
                             (DOWN_AFTER_MS + 3 * FAILOVER_TIMEOUT_MS) / 1000.0,
                             interval=0.02, msg="the sentinels to promote the replica")
                t_sentinels = time.monotonic() - t0
                assert role(replica) == "master"
                # Both nodes name the new master within 2 heartbeats of it.
                for gw in (a, b):
                    wait_master_seen(gw, replica.addr, 2 * HEARTBEAT + 0.25)
                t_seen = time.monotonic() - t0
                assert t_seen <= t_sentinels + 2 * HEARTBEAT + 0.25, (t_seen, t_sentinels)
                for gw in (a, b):
                    wait_follow(gw, replica.addr, 10)
                # Exact again: the 6 held leases on the new master, 2 more refused each.
                members = replica.lease_members("acme")
                assert len(members) == 6, members
                for gw in (a, b):
                    for _ in range(2):
                        c, r = try_stream(gw)
                        assert r.status == 429, (gw.name, r.status, bytes(r.data[:200]))
                assert stub.tag("acme")["max_inflight"] == MAX, stub.tag("acme")
                for gw in (a, b):
                    m = h.scrape(gw)
                    assert m.value("sluice_cluster_failovers_total") == 1, gw.name
                    st = json.loads(h.admin_request(h.admin_port(gw), "GET", "/status.json").text)
                    assert (st["cluster"]["master"], st["cluster"]["failovers"]) == \
                        (replica.addr, 1), st["cluster"]
                    log = h.stderr_text(gw)
                    assert re.search(r"cluster: Redis master 'sluice' switched from %s to %s "
                                     r"\(sentinel 127\.0\.0\.1:\d+, " % (
                                         re.escape(master.addr), re.escape(replica.addr)),
                                     log), log[-3000:]
                # The old master back: the sentinels demote it; no node uses it.
                if how == "stop":
                    master.thaw()
                else:
                    master.restart()
                h.wait_until(lambda: role(master) == "slave", 30, interval=0.1,
                             msg="the old master to be demoted")
                # A probe of ours (role() above) may still be listed a moment
                # after it closed; a node's connection would stay.
                h.wait_until(lambda: sluice_clients(master) == [], 3, interval=0.05,
                             msg="no client of the old master but the sentinels "
                             "and replication (%r)" % (sluice_clients(master),))
                for gw in (a, b):
                    assert healthz(gw) == ("redis", replica.addr)
                assert stub.tag("acme")["max_inflight"] == MAX, stub.tag("acme")
                for c in held:
                    c.close()
        finally:
            stop_all(sentinels + [replica, master])


@h.skip_under("valgrind")
@h.timeout(120)
def test_sentinel_failover_sigkill_nodes_follow_and_stay_exact():
    failover_case("kill")


@h.skip_under("valgrind")
@h.timeout(120)
def test_sentinel_failover_sigstop_nodes_follow_and_stay_exact():
    failover_case("stop")


@h.skip_under("valgrind")
@h.timeout(120)
def test_sentinel_failover_with_a_sentinel_killed_nodes_follow():
    failover_case("sentinel_killed")


# ---------------------------------------------------------------- bad answers

class ScriptedSentinel:
    """A peer on 127.0.0.1 that speaks the sentinel protocol sluice uses
    and answers get-master-addr-by-name with `answer` ("IP:port", or None
    for nil), to make the answers real sentinels give only in a race:
    a replica's address, a disagreement. `asked` counts the questions."""

    def __init__(self, answer, host=h.HOST):
        self.host = host
        self.answer = answer
        self.asked = 0
        self.subscribes = 0
        self.mute = False      # True: reads and never answers (a stalled sentinel)
        self._subscribed = []
        self._stop = False
        self._conns = []

    @property
    def addr(self):
        return ("[%s]:%d" if ":" in self.host else "%s:%d") % (self.host, self.port)

    def start(self):
        self.sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET,
                                  socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((self.host, 0))
        self.sock.listen(64)
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self._t = threading.Thread(target=self._accept, daemon=True)
        self._t.start()
        return self

    def _accept(self):
        while not self._stop:
            try:
                c, _ = self.sock.accept()
            except OSError:
                continue
            self._conns.append(c)
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c):
        c.settimeout(None)
        r = _RespReader(c)
        try:
            while True:
                cmd = r.reply()
                word = cmd[0].upper()
                if self.mute:
                    continue
                if word == "PING":
                    c.sendall(b"+PONG\r\n")
                elif word == "SENTINEL" and cmd[1].lower() == "get-master-addr-by-name":
                    self.asked += 1
                    a = self.answer
                    c.sendall(b"*-1\r\n" if a is None else
                              _resp_encode(a.rsplit(":", 1)))
                elif word == "SUBSCRIBE":
                    self.subscribes += 1
                    if c not in self._subscribed:
                        self._subscribed.append(c)
                    ch = cmd[1].encode()
                    c.sendall(b"*3\r\n$9\r\nsubscribe\r\n$%d\r\n%s\r\n:1\r\n" % (len(ch), ch))
                else:
                    c.sendall(b"-ERR unknown command\r\n")
        except (OSError, ConnectionError, AssertionError, IndexError):
            pass
        finally:
            c.close()

    def switch_master(self, old, new, name="sluice"):
        """Publish +switch-master to the subscribed connections, as a
        sentinel does once a failover is decided; how many got it."""
        body = ("%s %s %s" % (name, " ".join(old.rsplit(":", 1)),
                              " ".join(new.rsplit(":", 1)))).encode()
        msg = _resp_encode([b"message", b"+switch-master", body])
        n = 0
        for c in list(self._subscribed):
            try:
                c.sendall(msg)
                n += 1
            except OSError:
                pass
        return n

    def stop(self):
        self._stop = True
        self._t.join(timeout=2)
        for c in self._conns:
            try:
                c.close()
            except OSError:
                pass
        self.sock.close()


def test_sentinel_majority_wins_nil_and_dissent_are_logged():
    """Four sentinels: one does not monitor the name (nil), one names the
    replica, two name the master: the node takes the master (2 of the 3
    that answered) and logs the other two."""
    with Redis(name="redis-master") as master, Stub() as stub:
        replica = Redis(name="redis-replica", args=["--replicaof", h.HOST, master.port])
        fakes = [ScriptedSentinel(None).start(), ScriptedSentinel(None).start(),
                 ScriptedSentinel(master.addr).start(), ScriptedSentinel(master.addr).start()]
        try:
            replica.start()
            fakes[1].answer = replica.addr
            with sentinel_gw(stub, fakes, "gw-a") as a:
                wait_follow(a, master.addr, 10)
                log = h.stderr_text(a)
                assert "cluster: sentinel %s: it does not monitor 'sluice' (nil)" % \
                    fakes[0].addr in log, log[-3000:]
                assert "cluster: sentinel %s says master 'sluice' is %s; the majority " \
                    "(2 of 3 that answered) says %s" % (fakes[1].addr, replica.addr,
                                                       master.addr) in log, log[-3000:]
                assert "cluster: Redis master 'sluice' is %s (sentinel %s)" % (
                    master.addr, fakes[2].addr) in log, log[-3000:]
                hold(a, 1)
                assert master.leases("acme") == 1
                assert h.scrape(a).value("sluice_cluster_failovers_total") == 0
        finally:
            for f in fakes:
                f.stop()
            replica.kill()


def test_sentinel_naming_a_replica_is_refused_until_it_names_the_master():
    """Every sentinel names an address whose ROLE is slave: the node does
    not use it (on_redis_down, nothing written there) and asks again; once
    they name the master, it admits through it."""
    with Redis(name="redis-master") as master, Stub() as stub:
        replica = Redis(name="redis-replica", args=["--replicaof", h.HOST, master.port])
        fakes = []
        try:
            replica.start()
            fakes = [ScriptedSentinel(replica.addr).start() for _ in range(3)]
            with sentinel_gw(stub, fakes, "gw-a") as a:
                h.wait_until(lambda: "%s is not a master (ROLE: slave)" % replica.addr
                             in h.stderr_text(a), 10, msg="the ROLE refusal logged")
                asked = sum(f.asked for f in fakes)
                h.wait_until(lambda: sum(f.asked for f in fakes) > asked, 10,
                             msg="the node to ask again")
                assert healthz(a)[0] == "local_share", healthz(a)
                assert replica.command("KEYS", "sluice:*") == []
                assert master.command("KEYS", "sluice:*") == []
                for f in fakes:
                    f.answer = master.addr
                wait_follow(a, master.addr, 10)
                hold(a, 1)
                assert master.leases("acme") == 1
        finally:
            for f in fakes:
                f.stop()
            replica.kill()


def test_sentinel_all_down_node_stays_on_redis_down_then_finds_the_master():
    """No sentinel reachable: the node starts in on_redis_down (local_share
    admits its share), /healthz names no master, it asks again with
    backoff; a sentinel started later is found."""
    with Redis(name="redis-master") as master, Stub() as stub:
        sentinels = [Sentinel(master, quorum=1, port=h.closed_port()) for _ in range(3)]
        try:
            with sentinel_gw(stub, sentinels, "gw-a") as a:
                assert healthz(a) == ("local_share", "unknown")
                log = h.stderr_text(a)
                assert "cluster: no sentinel of 3 knows master 'sluice' (0 reachable)" in log, \
                    log[-3000:]
                held = hold(a, MAX)       # a node alone: its share is all of it
                c, r = try_stream(a)
                assert r.status == 429, r.status
                sentinels[1].start()
                wait_follow(a, master.addr, 15)
                # The streams admitted meanwhile got their leases on the master.
                h.wait_until(lambda: master.leases("acme") == MAX, 5,
                             msg="the %d local admissions re-added" % MAX)
                c, r = try_stream(a)
                assert r.status == 429, r.status
                for c in held:
                    c.close()
        finally:
            stop_all(sentinels)


# ---------------------------------------------------------------- black-box

def subscribers(sentinel):
    """Connections to sentinel subscribed to a channel: a sluice node's
    +switch-master subscription (sentinels do not subscribe to each other)."""
    out = 0
    for line in sentinel.command("CLIENT", "LIST").splitlines():
        f = dict(kv.split("=", 1) for kv in line.split(" ") if "=" in kv)
        if int(f.get("sub", "0")) > 0:
            out += 1
    return out


def test_sentinel_that_accepts_but_never_answers_is_passed_over():
    """The first sentinel accepts TCP and never answers: the node asks the
    next one (within cluster.timeout), admits through the master it names,
    and its +switch-master subscription moves on to the sentinel that
    answers instead of waiting on the silent one for ever."""
    with Redis(name="redis-master") as master, Stub() as stub, h.BlackHole() as hole:
        real = Sentinel(master, quorum=1).start()
        try:
            with sentinel_gw(stub, [hole, real], "gw-a") as a:
                wait_follow(a, master.addr, 10)
                assert "cluster: sentinel %s: no answer within cluster.timeout (200ms)" % \
                    hole.addr in h.stderr_text(a), a.stderr_tail()
                h.wait_until(lambda: subscribers(real) == 1, 10, interval=0.1,
                             msg="the subscription on the sentinel that answers "
                             "(%d connections to the silent one)" % hole.accepted)
                held = hold(a, 2)
                assert master.leases("acme") == 2
                for c in held:
                    c.close()
        finally:
            real.kill()


def test_sentinel_password_wrong_is_named_and_the_node_stays_down():
    """Sentinels with requirepass and a wrong cluster.sentinel_password:
    the log names cluster.sentinel_password (not cluster.password, which is
    the master's), the node stays in on_redis_down naming no master, and
    it does not reconnect in a tight loop."""
    with Redis(name="redis-master") as master, Stub() as stub:
        s = Sentinel(master, quorum=1, password="s3cret").start()
        try:
            with sentinel_gw(stub, [s], "gw-a",
                             cluster={"sentinel_password": "wrong"}) as a:
                h.wait_until(lambda: "check cluster.sentinel_password" in h.stderr_text(a),
                             10, msg="the refusal logged")
                assert healthz(a) == ("local_share", "unknown")
                def conns():
                    info = s.command("INFO", "stats")
                    return int(re.search(r"total_connections_received:(\d+)", info).group(1))
                # The backoff grows to its 5 s cap: past the first
                # attempts, a few connections a few seconds at most.
                time.sleep(4)
                n0 = conns()
                time.sleep(3)
                assert conns() - n0 <= 8, conns() - n0
                log = h.stderr_text(a)
                assert "check cluster.password" not in log, log[-3000:]
                assert "set cluster.password" not in log, log[-3000:]
                assert healthz(a) == ("local_share", "unknown")
                assert master.command("KEYS", "sluice:*") == []
        finally:
            s.kill()


def test_sentinel_password_right_finds_and_follows():
    """With the sentinels' requirepass in cluster.sentinel_password the
    node asks and subscribes (both AUTH first)."""
    with Redis(name="redis-master") as master, Stub() as stub:
        s = Sentinel(master, quorum=1, password="s3cret").start()
        try:
            with sentinel_gw(stub, [s], "gw-a",
                             cluster={"sentinel_password": "s3cret"}) as a:
                wait_follow(a, master.addr, 10)
                h.wait_until(lambda: subscribers(s) == 1, 10, interval=0.1,
                             msg="the subscription, authenticated")
        finally:
            s.kill()


def test_sentinel_password_missing_says_to_set_sentinel_password():
    """Sentinels with requirepass and no cluster.sentinel_password: the
    log says to set cluster.sentinel_password, never cluster.password."""
    with Redis(name="redis-master") as master, Stub() as stub:
        s = Sentinel(master, quorum=1, password="s3cret").start()
        try:
            with sentinel_gw(stub, [s], "gw-a") as a:
                want = "cluster: sentinel %s: it wants a password: NOAUTH" % s.addr
                h.wait_until(lambda: want in h.stderr_text(a), 10, msg="the NOAUTH logged")
                log = h.stderr_text(a)
                assert "(set cluster.sentinel_password)" in log, log[-3000:]
                assert "cluster.password" not in log, log[-3000:]
                assert healthz(a) == ("local_share", "unknown")
        finally:
            s.kill()


@h.timeout(60)
def test_sentinel_reload_keeps_following_and_says_what_it_keeps():
    """SIGHUP with sentinels: unchanged, no warning; a changed sentinels
    list warns that it needs a restart and names the sentinels kept. A
    stream held across both continues, and the new workers admit through
    the same master."""
    with Redis(name="redis-master") as master, Stub() as stub:
        s = Sentinel(master, quorum=1).start()
        try:
            with sentinel_gw(stub, [s], "gw-a", allow_worker_changes=True) as a:
                wait_follow(a, master.addr, 10)
                c, r = try_stream(a)
                assert r.status == 200, r.status
                r.read_events(1, timeout=5)
                h.reload(a, a.config)
                assert "need a restart" not in h.stderr_text(a), a.stderr_tail()
                cfg = h.deep_merge(a.config, {"cluster": {
                    "sentinels": [s.addr, "127.0.0.1:%d" % h.closed_port()]}})
                h.reload(a, cfg)
                assert "reload: 'cluster' redis, sentinels, master_name, sentinel_password, " \
                    "password, node (or adding or removing the section) need a restart; " \
                    "keeping sentinels %s (master 'sluice')" % s.addr in h.stderr_text(a), \
                    a.stderr_tail()
                n = len(r.events)
                r.read_events(n + 2, timeout=5)
                assert len(r.events) >= n + 2 and not r.done, (len(r.events), r.done)
                assert healthz(a) == ("redis", master.addr)
                c2, r2 = try_stream(a)
                assert r2.status == 200, r2.status
                assert master.leases("acme") == 2
                assert h.scrape(a).value("sluice_cluster_failovers_total") == 0
                c.close()
                c2.close()
        finally:
            s.kill()


@h.timeout(60)
def test_sentinel_master_restarted_empty_gets_the_leases_back():
    """The master the sentinels name restarts without its data (as a
    promoted replica restarted empty would): the node re-adds the leases
    of its streams in flight on it, as for a Redis restart, and stays
    exact; it is no failover (same address)."""
    with Redis(name="redis-master") as master, Stub() as stub:
        s = Sentinel(master, quorum=1, down_after_ms=5000).start()
        try:
            with sentinel_gw(stub, [s], "gw-a") as a:
                wait_follow(a, master.addr, 10)
                held = hold(a, 4)
                h.wait_until(lambda: master.leases("acme") == 4, 5, msg="4 leases")
                master.kill()
                master.restart()
                h.wait_until(lambda: master.leases("acme") == 4, 10, interval=0.05,
                             msg="the 4 leases re-added on the empty master")
                wait_follow(a, master.addr, 10)
                assert master.nodes() == ["gw-a"]
                held += hold(a, MAX - 4)
                c, r = try_stream(a)
                assert r.status == 429, r.status
                assert master.leases("acme") == MAX
                assert h.scrape(a).value("sluice_cluster_failovers_total") == 0
                for c in held:
                    c.close()
        finally:
            s.kill()


def test_sentinel_answering_a_host_name_is_refused_not_resolved():
    """Sentinels with announce-hostnames answer a host name: sluice does
    not resolve host names (a blocking lookup would stall the master's
    and the workers' loops), so it refuses the answer with a log line
    that says what to change, stays in on_redis_down and writes nothing."""
    with Redis(name="redis-master") as master, Stub() as stub:
        fake = ScriptedSentinel("localhost:%d" % master.port).start()
        try:
            with sentinel_gw(stub, [fake], "gw-a") as a:
                want = ("cluster: sentinel %s: it names master 'sluice' by host name "
                        "'localhost' (not resolved: set the sentinels' "
                        "announce-hostnames no)" % fake.addr)
                h.wait_until(lambda: want in h.stderr_text(a), 10, msg="the refusal logged")
                asked = fake.asked
                h.wait_until(lambda: fake.asked > asked, 10, msg="the node to ask again")
                assert healthz(a) == ("local_share", "unknown")
                assert master.command("KEYS", "sluice:*") == []
                # Once it answers an address, the node follows it.
                fake.answer = master.addr
                wait_follow(a, master.addr, 15)
        finally:
            fake.stop()


@h.timeout(60)
def test_sentinels_that_never_answer_do_not_stall_healthz_or_streams():
    """Two of three sentinels accept and never answer, and the master's
    Redis goes away: the master process asks again at every reconnect,
    each silent sentinel bounded by cluster.timeout (200 ms), so /healthz
    answers within a bounded time throughout and a stream in flight keeps
    flowing."""
    with Redis(name="redis-master") as master, Stub() as stub, \
            h.BlackHole() as hole1, h.BlackHole() as hole2:
        real = Sentinel(master, quorum=1, down_after_ms=60000).start()
        try:
            with sentinel_gw(stub, [hole1, hole2, real], "gw-a") as a:
                wait_follow(a, master.addr, 10)
                c, r = try_stream(a)
                assert r.status == 200, r.status
                r.read_events(1, timeout=5)
                master.kill()
                h.wait_until(lambda: healthz(a)[0] == "local_share", 5,
                             msg="the node to notice the loss")
                asked = hole1.accepted
                worst = 0.0
                t_end = time.monotonic() + 4
                while time.monotonic() < t_end:
                    t0 = time.monotonic()
                    assert healthz(a) == ("local_share", master.addr)
                    worst = max(worst, time.monotonic() - t0)
                # The master did ask the silent sentinels meanwhile, and a
                # /healthz never waited more than two of them (0.4 s) and slack.
                assert hole1.accepted > asked, (hole1.accepted, asked)
                assert worst < 1.5, worst
                n = len(r.events)
                r.read_events(n + 3, timeout=5)
                assert len(r.events) >= n + 3 and not r.done
                c.close()
        finally:
            real.kill()


@h.timeout(60)
def test_sentinel_that_stalls_after_subscribe_loses_the_subscription():
    """The sentinel the node is subscribed to stops answering (stalled,
    SIGSTOP-like: the kernel keeps the connection): the node notices within
    a bounded time and subscribes to the next sentinel, instead of hearing
    of no failover for ever."""
    with Redis(name="redis-master") as master, Stub() as stub:
        fake = ScriptedSentinel(master.addr).start()
        real = Sentinel(master, quorum=1).start()
        try:
            with sentinel_gw(stub, [fake, real], "gw-a") as a:
                wait_follow(a, master.addr, 10)
                h.wait_until(lambda: fake.subscribes >= 1, 10, msg="subscribed to the first")
                assert subscribers(real) == 0
                fake.mute = True
                h.wait_until(lambda: subscribers(real) == 1, 15, interval=0.1,
                             msg="the subscription moved to the sentinel that answers")
                assert "cluster: sentinel %s: no answer to SUBSCRIBE in time; following " \
                    "through the next sentinel" % fake.addr in h.stderr_text(a), \
                    a.stderr_tail()
                assert healthz(a) == ("redis", master.addr)
        finally:
            fake.stop()
            real.kill()


@h.timeout(60)
def test_sentinel_switch_master_is_followed_though_other_sentinels_lag():
    """+switch-master is published once the failover is decided; the other
    sentinels may still name the old master for a moment. The node follows
    the switch (one failover, logged once) and does not switch back to the
    old master because the laggards' answers are the majority."""
    with Redis(name="redis-old") as old, Redis(name="redis-new") as new, Stub() as stub:
        fakes = [ScriptedSentinel(old.addr).start() for _ in range(3)]
        try:
            with sentinel_gw(stub, fakes, "gw-a") as a:
                wait_follow(a, old.addr, 10)
                h.wait_until(lambda: fakes[0].subscribes >= 1, 10, msg="subscribed")
                # Only the subscribed sentinel knows yet; the others lag.
                fakes[0].answer = new.addr
                assert fakes[0].switch_master(old.addr, new.addr) == 1
                wait_follow(a, new.addr, 10)
                h.wait_until(lambda: new.nodes() == ["gw-a"], 5, msg="registered on new")
                held = hold(a, 1)
                # Through the worker's connection, or admitted locally while
                # it reconnects and re-added by the next heartbeat.
                h.wait_until(lambda: new.leases("acme") == 1, 5, interval=0.05,
                             msg="the lease on the new master")
                assert healthz(a) == ("redis", new.addr)
                # Its connections cut: it asks again, and the laggards'
                # majority naming the old master is not followed.
                new.command("CLIENT", "KILL", "TYPE", "normal")
                want = "cluster: sentinel %s still names %s, the master 'sluice' switched " \
                    "from; keeping %s" % (fakes[1].addr, old.addr, new.addr)
                h.wait_until(lambda: want in h.stderr_text(a), 10, msg="the laggards logged")
                wait_follow(a, new.addr, 10)
                assert h.scrape(a).value("sluice_cluster_failovers_total") == 1
                log = h.stderr_text(a)
                assert "switched from %s to %s" % (new.addr, old.addr) not in log, log[-3000:]
                assert old.leases("acme") == 0
                for c in held:
                    c.close()
        finally:
            for f in fakes:
                f.stop()


@h.timeout(60)
def test_sentinel_reload_of_cluster_timeout_applies_to_the_sentinels():
    """cluster.timeout is taken by a reload: the next ask waits on a
    silent sentinel for the new value, and the log says that value."""
    with Redis(name="redis-master") as master, Stub() as stub, h.BlackHole() as hole:
        real = Sentinel(master, quorum=1).start()
        try:
            with sentinel_gw(stub, [hole, real], "gw-a", allow_worker_changes=True) as a:
                wait_follow(a, master.addr, 10)
                assert "cluster: sentinel %s: no answer within cluster.timeout (200ms)" % \
                    hole.addr in h.stderr_text(a)
                h.reload(a, h.deep_merge(a.config, {"cluster": {"timeout": "300ms"}}))
                master.command("CLIENT", "KILL", "TYPE", "normal")
                want = "cluster: sentinel %s: no answer within cluster.timeout (300ms)" % \
                    hole.addr
                h.wait_until(lambda: want in h.stderr_text(a), 10, msg="the new timeout")
                wait_follow(a, master.addr, 10)
        finally:
            real.kill()


def zrem_calls(redis):
    m = re.search(r"cmdstat_zrem:calls=(\d+)", redis.command("INFO", "commandstats"))
    return int(m.group(1)) if m else 0


@h.timeout(60)
def test_sentinel_switch_no_release_goes_to_the_old_master():
    """Streams that end right after a +switch-master, before each worker
    has moved to the new master: their releases are not written to the old
    master (no node writes to a master the sentinels replaced), and their
    leases are gone from the new one within lease_ttl."""
    with Redis(name="redis-old") as old, Redis(name="redis-new") as new, Stub() as stub:
        fakes = [ScriptedSentinel(old.addr).start() for _ in range(3)]
        try:
            with sentinel_gw(stub, fakes, "gw-a", workers=1,
                             cluster={"heartbeat": "1s"}) as a:
                wait_follow(a, old.addr, 10)
                h.wait_until(lambda: fakes[0].subscribes >= 1, 10, msg="subscribed")
                held = hold(a, 4)
                h.wait_until(lambda: old.leases("acme") == 4, 5, msg="4 leases")
                before = zrem_calls(old)
                for f in fakes:
                    f.answer = new.addr
                assert fakes[0].switch_master(old.addr, new.addr) == 1
                h.wait_until(lambda: healthz(a)[1] == new.addr, 5, interval=0.005,
                             msg="the master to follow")
                for c in held:
                    c.close()
                wait_follow(a, new.addr, 10)
                h.wait_until(lambda: new.leases("acme") == 0, 6, interval=0.05,
                             msg="the released leases gone from the new master")
                assert zrem_calls(old) == before, (zrem_calls(old), before)
        finally:
            for f in fakes:
                f.stop()


def test_sentinel_on_ipv6_loopback_is_asked_and_followed():
    """A sentinel listed as [::1]:port is asked and subscribed to, and a
    +switch-master from it is followed."""
    with Redis(name="redis-old") as old, Redis(name="redis-new") as new, Stub() as stub:
        fake = ScriptedSentinel(old.addr, host="::1").start()
        try:
            with sentinel_gw(stub, [fake], "gw-a") as a:
                wait_follow(a, old.addr, 10)
                assert "(sentinel [::1]:%d)" % fake.port in h.stderr_text(a)
                h.wait_until(lambda: fake.subscribes >= 1, 10, msg="subscribed")
                fake.answer = new.addr
                assert fake.switch_master(old.addr, new.addr) == 1
                wait_follow(a, new.addr, 10)
                assert h.scrape(a).value("sluice_cluster_failovers_total") == 1
        finally:
            fake.stop()


@h.timeout(60)
def test_sentinel_dissent_and_disagreement_are_logged_once_not_every_ask():
    """A sentinel that keeps naming another address is logged once, not at
    every ask (every reconnect); likewise sentinels that disagree with no
    majority, until they agree again."""
    with Redis(name="redis-master") as master, Redis(name="redis-other") as other, \
            Stub() as stub:
        # The dissenter first: asked every time (two agreeing end an ask).
        fakes = [ScriptedSentinel(other.addr).start(), ScriptedSentinel(master.addr).start(),
                 ScriptedSentinel(master.addr).start()]
        try:
            with sentinel_gw(stub, fakes, "gw-a", workers=1) as a:
                wait_follow(a, master.addr, 10)
                dissent = "cluster: sentinel %s says master 'sluice' is %s; the majority" % (
                    fakes[0].addr, other.addr)
                for _ in range(3):
                    asked = fakes[1].asked
                    master.command("CLIENT", "KILL", "TYPE", "normal")
                    h.wait_until(lambda: fakes[1].asked > asked, 10, msg="asked again")
                    wait_follow(a, master.addr, 10)
                assert h.stderr_text(a).count(dissent) == 1, a.stderr_tail()
                # No majority: one says other, one master, one nil.
                fakes[2].answer = None
                disagree = "cluster: the sentinels disagree on master 'sluice'"
                for _ in range(3):
                    asked = fakes[1].asked
                    master.command("CLIENT", "KILL", "TYPE", "normal")
                    h.wait_until(lambda: fakes[1].asked > asked, 10, msg="asked again")
                h.wait_until(lambda: disagree in h.stderr_text(a), 5, msg="disagreement")
                assert h.stderr_text(a).count(disagree) == 1, a.stderr_tail()
        finally:
            for f in fakes:
                f.stop()
