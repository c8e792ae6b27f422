/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sl_stored: which replica holds each stored response (the Responses
 * API's previous_response_id, GET/DELETE /v1/responses/{id}), shared by
 * the master and every worker.
 *
 * A runner such as vLLM keeps stored responses in its own memory: a
 * follow-up naming one must reach the replica that made it. Workers learn
 * (id -> replica) from each relayed response (sl_stored_put) and look ids
 * up before choosing a replica (sl_stored_get); a request on worker 1
 * finds an id learnt on worker 0.
 *
 * What it guarantees:
 *   - Per pool (an upstream slot, stable across reloads: sl_slots.h), at
 *     most `max` ids, the least recently used (learnt or looked up)
 *     evicted first, exactly; an id unused for `ttl` is gone (looked up:
 *     not found). All pools draw their entries from one slab of
 *     SL_STORED_CAP: when the pools' max add up to more and the slab is
 *     full, the least recently used id of any pool goes.
 *   - A replica is named by a 64-bit identity of its URL (the caller's,
 *     sl_affinity_id), not by its index: a reload that keeps the replica
 *     keeps its ids, one that removes it leaves ids naming a replica the
 *     pool no longer has (the caller balances).
 *   - Ids are kept as two independent 64-bit hashes of their bytes, not
 *     the bytes: two ids are confused with odds of 2^-128 a pair.
 *   - A process killed at any instant wedges nobody: one process-shared
 *     robust mutex, and an entry's state written last; the next to lock
 *     an owner-dead mutex rebuilds every list, chain and count from the
 *     entries (their state and a global use order), keeping the LRU
 *     order exact.
 *
 * Cost: one lock per request that names an id and one per response
 * learnt, each a hash probe and a list splice. Room is reserved, not
 * committed (MAP_NORESERVE): a page costs memory once an entry on it is
 * used (64 bytes an id, and a 4-byte bucket).
 *
 * Use: the master creates the table before forking (sl_stored_create),
 * publishes each upstream's max and ttl on start and reload
 * (sl_stored_set_pool: a lower max evicts at once, a new ttl applies to
 * every id at its next look-up) and resets a pool slot before it goes to
 * another upstream (sl_stored_reset_pool).
 */
#ifndef SL_STORED_H
#define SL_STORED_H

#include <stddef.h>
#include <stdint.h>

struct sl_stored;

/* Entries in all (the slab), and the most one pool may keep. */
#define SL_STORED_CAP (1u << 20)
#define SL_STORED_MAX 1000000

/*
 * Master, before fork: an empty table for npools pools (upstream slots),
 * every pool off (max 0). NULL (errno) on failure. cap: SL_STORED_CAP
 * outside tests.
 */
struct sl_stored *sl_stored_create(size_t npools, size_t cap);
void sl_stored_destroy(struct sl_stored *);

/*
 * Master, on start and reload: pool's bound (0: off, nothing learnt or
 * found; its ids dropped) and ttl (ms, > 0). Ids over the new max are
 * evicted now, least recently used first.
 */
void sl_stored_set_pool(struct sl_stored *, size_t pool, uint32_t max,
    uint64_t ttl_ms);
/* Master: forget every id of pool (its slot goes to another upstream). */
void sl_stored_reset_pool(struct sl_stored *, size_t pool);

/* Anyone, lock-free: pool learns and finds ids (max > 0). */
int sl_stored_on(const struct sl_stored *, size_t pool);

/*
 * Any process: id (len bytes, 1..255) was made by replica `owner`, now
 * (CLOCK_MONOTONIC ms). Inserted or updated, most recently used; the
 * least recently used goes when pool is at its max.
 */
void sl_stored_put(struct sl_stored *, size_t pool, const char *id,
    size_t len, uint64_t owner, int64_t now_ms);

/*
 * Any process: the replica that made id, in *owner, and id becomes the
 * most recently used: 0. -1: unknown (never learnt, evicted, or expired:
 * then removed).
 */
int sl_stored_get(struct sl_stored *, size_t pool, const char *id,
    size_t len, int64_t now_ms, uint64_t *owner);

/* Ids pool holds now (expired ones not yet removed included). */
size_t sl_stored_count(struct sl_stored *, size_t pool);

/*
 * Tests: the ids of pool from most to least recently used, their owners
 * in owners[0..max) (either may be NULL); returns how many there are.
 */
size_t sl_stored_walk(struct sl_stored *, size_t pool, uint64_t *owners,
    size_t max);

/*
 * Tests and debugging: take the lock and verify every invariant (chains,
 * lists in use order, counts, free list). 0, or -1 and why.
 */
int sl_stored_check(struct sl_stored *, char *why, size_t whylen);
/* Times an owner-dead lock was repaired. */
uint64_t sl_stored_repairs(const struct sl_stored *);
/* Tests only: take the lock and keep it (a child exiting leaves it dead). */
void sl_stored_lock_for_test(struct sl_stored *);

/*
 * The id of a relayed answer to POST /v1/responses, read as its bytes
 * pass (one call per read, nothing copied but the id): the top-level
 * "id" of a JSON body, or in an event stream the "id" of the first
 * event's "response" object (response.created). Bounded: only the first
 * SL_STORED_SCAN_MAX bytes are read; an id with an escape, or longer
 * than SL_STORED_ID_MAX, is not learnt.
 */
#define SL_STORED_ID_MAX 255
#define SL_STORED_SCAN_MAX 65536
struct sl_stored_scan {
	uint32_t seen;           /* bytes read */
	uint8_t sse;             /* the body is an event stream */
	uint8_t done;            /* found, or given up: read no more */
	uint8_t line;            /* SSE: 0 line start, 1 field name, 2 data,
	                          * 3 another field's value */
	uint8_t fpos;            /* SSE: bytes of the field name matched */
	uint8_t lead;            /* SSE: the data value's leading space seen */
	uint8_t in_str, esc;     /* inside a JSON string, after a backslash */
	uint8_t want;            /* the next token is a key (object) */
	uint8_t is_key;          /* the string being read is a key */
	uint8_t capture;         /* the string being read is the id */
	uint8_t klen;            /* key bytes kept (KEY_MAX at most) */
	uint8_t arr[4];          /* depth 1..4: 1 an array, 0 an object */
	int32_t depth;
	int32_t match;           /* depth of the path matched so far */
	char key[12];            /* the key read last, its first bytes */
	uint16_t idlen;
	char id[SL_STORED_ID_MAX + 1];
};

/* Start reading an answer (sse: its Content-Type is text/event-stream). */
void sl_stored_scan_init(struct sl_stored_scan *, int sse);
/* Read n more bytes: 1 when the id is known (in s->id, s->idlen). */
int sl_stored_scan_feed(struct sl_stored_scan *, const char *p, size_t n);

#endif
