/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sl_affinity: prompt-prefix affinity for balance: prefix_affinity.
 *
 * Pure: no I/O, no logging, no globals. Three pieces:
 *
 *  1. Block hashes of a request's prompt. The prompt text is cut into
 *     blocks of `block` bytes; h[i] = mix(h[i-1], bytes of block i), so
 *     h[i] names the whole prefix up to the end of block i and two prompts
 *     share exactly the hashes of the full blocks they share. Only full
 *     blocks are hashed (a partial last block is left out: the next turn
 *     will extend it), except that a prompt shorter than one block gives
 *     one hash of all its bytes. The hash is a fixed function of the bytes
 *     (64-bit words read little-endian byte by byte, no seed, no pointer
 *     or endianness dependence), so every worker of every sluice node
 *     computes the same values.
 *
 *  2. struct sl_affinity: one worker's memory of where prefixes went. A
 *     hash table of (upstream index, block hash) -> replica index with
 *     `capacity` entries in total, all allocated by sl_affinity_new();
 *     lookup and record never allocate. When full, recording evicts the
 *     least recently recorded entry. An entry costs 24 bytes plus 8 to 16
 *     bytes of index (the index has the power of two >= 2 x capacity
 *     slots): 65536 entries take 2 MiB per worker.
 *
 *  3. Rendezvous (highest random weight) hashing, for a prompt with no
 *     known prefix: every node picks the same replica for the same first
 *     block, and removing a replica moves only the keys it had.
 *
 * Lookup semantics and cost. sl_affinity_lookup() answers the highest i
 * with h[i] known, scanning from h[n-1] down and stopping at the first
 * hit: exact even where h[0..i) has holes, at n - matched probes (each a
 * hash and usually one cache line). A binary search would be O(log n) but
 * can miss the longest match behind a hole, and holes happen (a shared
 * prefix block re-recorded for another replica and then dropped with it).
 * Recording writes h[n-1] first and h[0] last, so a chain's shorter
 * prefixes are always at least as recent as its longer ones and eviction
 * takes the longest suffixes first; a repeated conversation therefore
 * costs one probe per block added since its last turn, and a new prompt
 * n probes (n <= the max the caller passed to sl_affinity_hashes).
 */
#ifndef SL_AFFINITY_H
#define SL_AFFINITY_H

#include <stddef.h>
#include <stdint.h>

struct json_t;
struct sl_affinity;

/*
 * Hashes of the prompt of a chat/completions or completions request body
 * (JSON, parsed with jansson): the concatenated messages[].content (content
 * may be a string or an array of parts; take the "text" of parts of type
 * "text"), or "prompt" (string, or array of strings concatenated). The prompt
 * is cut into blocks of `block` bytes; h[i] = mix(h[i-1], block i) (chained,
 * so h[i] identifies the whole prefix up to block i). Only full blocks,
 * except that a prompt shorter than one block gives one hash of what there
 * is. At most max hashes (prefix kept). Returns the count, 0 when the body
 * is not such JSON or has no prompt. Deterministic across processes and
 * machines: no random seed (every sluice node must agree).
 *
 * Details: "messages" is used when it is an array, else "prompt"; contents
 * are concatenated with nothing between them; parts of other types, non-string
 * contents and non-string prompt elements (token ids) are skipped. block == 0
 * or max == 0 gives 0.
 */
size_t sl_affinity_hashes(const char *body, size_t len, size_t block, uint64_t *h, size_t max);

/* The same from a body the caller already parsed (root is borrowed). */
size_t sl_affinity_hashes_json(const struct json_t *root, size_t block, uint64_t *h,
    size_t max);

/*
 * The same over raw prompt text: what the two above compute once they have
 * the concatenated prompt (for tests, the fuzz target and tools that must
 * agree with sluice, such as the bench stub's prefix cache).
 */
size_t sl_affinity_hash_text(const char *text, size_t len, size_t block, uint64_t *h,
    size_t max);

/*
 * Per-worker memory of which replica each prefix block was routed to:
 * a bounded hash table with LRU eviction, `capacity` entries in total
 * (e.g. 65536), keyed by (upstream index, block hash) -> replica index.
 * NULL when capacity is 0 or over SL_AFFINITY_MAX_CAPACITY, or out of memory.
 * Caller owns the result; free with sl_affinity_free().
 */
#define SL_AFFINITY_MAX_CAPACITY (1u << 24)
struct sl_affinity *sl_affinity_new(uint32_t capacity);
void sl_affinity_free(struct sl_affinity *a);

/*
 * Longest cached prefix: the replica holding the highest i with h[i] known
 * (for this upstream); *matched = i + 1 blocks; -1 and *matched = 0 if none.
 * Does not change recency (record() after routing does).
 */
int sl_affinity_lookup(struct sl_affinity *a, uint32_t upstream, const uint64_t *h, size_t n,
    size_t *matched);

/*
 * The same, and *ended (when not NULL) = 1 when the matched block was the
 * last block of a prompt recorded before (an earlier turn of this
 * conversation ended there), 0 when it was only ever inside longer prompts:
 * a prefix other prompts share, such as a system prompt. 0 when none.
 */
int sl_affinity_lookup_end(struct sl_affinity *a, uint32_t upstream, const uint64_t *h,
    size_t n, size_t *matched, int *ended);

/*
 * Remember that h[0..n) were routed to replica (overwrites, refreshes LRU;
 * replica 0..32767) and that h[n-1] ended a prompt (that mark stays while
 * the entry lives). Call once the replica is chosen, with the hashes of the
 * request (all, or those past a prefix left where it was).
 */
void sl_affinity_record(struct sl_affinity *a, uint32_t upstream, const uint64_t *h, size_t n,
    int replica);

/* Forget every entry of this replica (it went down or was removed). O(capacity). */
void sl_affinity_drop_replica(struct sl_affinity *a, uint32_t upstream, int replica);

/* Forget everything of one upstream (its replica list changed on reload). O(capacity). */
void sl_affinity_drop_upstream(struct sl_affinity *a, uint32_t upstream);

/* Entries in use (for tests and a metric). */
uint32_t sl_affinity_size(const struct sl_affinity *a);

/* The capacity given to sl_affinity_new(). */
uint32_t sl_affinity_capacity(const struct sl_affinity *a);

/*
 * Rendezvous (highest random weight) choice: index in ids[0..n) maximising
 * a mix of (key, ids[i]); ids are stable replica identities (e.g. a hash of
 * the replica URL, see sl_affinity_id). Deterministic, no seed. -1 if n == 0.
 * Equal ids tie to the lowest index.
 */
int sl_affinity_rendezvous(uint64_t key, const uint64_t *ids, size_t n);

/* The same with weights[0..n) (> 0): candidate i wins weights[i] / sum of keys. */
int sl_affinity_rendezvous_weighted(uint64_t key, const uint64_t *ids, const int *weights,
    size_t n);

/* Stable 64-bit hash of a NUL-terminated string (same on every machine). */
uint64_t sl_affinity_id(const char *s);

#endif
