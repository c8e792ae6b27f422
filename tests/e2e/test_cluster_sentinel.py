# SPDX-License-Identifier: BSD-2-Clause
"""cluster.sentinels: the nodes find the Redis master through Redis Sentinel
and follow a failover (issue 36; sluice.8 CLUSTER). A real topology on
127.0.0.1: a master, a replica (--replicaof), three redis-sentinel, two
sluice nodes and the stub; every process started and ended by pid."""

import re
import signal
import time

import harness as h
from harness import ACME_KEY, Gateway, Redis, Sentinel, Stub

MAX = 6
HEARTBEAT = 0.5
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 4000
LONG = dict(events=100000, interval=200)    # a stream that lasts until cut


def sentinel_gw(stub, sentinels, node, on_redis_down="local_share", workers=2, **over):
    cfg = h.gateway_config(
        stub, workers=workers, log_level="info",
        admin_listen="%s:%d" % (h.HOST, h.free_port()),
        tenants={"acme": {"max_streams": MAX, "retry_after": 2}},
        cluster={"sentinels": [s.addr for s in sentinels], "master_name": "sluice",
                 "node": node, "lease_ttl": "4s", "heartbeat": "%dms" % (HEARTBEAT * 1000),
                 "timeout": "200ms", "on_redis_down": on_redis_down})
    cfg = h.deep_merge(cfg, over)
    return Gateway(cfg, name=node)


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
                assert replica.leases("acme") == 6, replica.lease_members("acme")
                for gw in (a, b):
                    for _ in range(2):
                        c, r = try_stream(gw)
                        assert r.status == 429, (gw.name, r.status, bytes(r.data[:200]))
                assert stub.tag("acme")["max_inflight"] == MAX, stub.tag("acme")
                for gw in (a, b):
                    m = h.scrape(gw)
                    assert m.value("sluice_cluster_failovers_total") == 1, gw.name
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
                assert sluice_clients(master) == [], sluice_clients(master)
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
