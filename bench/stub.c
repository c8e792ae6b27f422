/* SPDX-License-Identifier: BSD-2-Clause */
/*
 * sluice-stub: an OpenAI-compatible model-runner stub for tests and benchmarks.
 *
 * It stands where vLLM / TGI / llama.cpp would stand behind the gateway, but its
 * answers are steered by request headers and it counts what it sees, so a test can
 * prove what the gateway let through (concurrency per tenant, backpressure, cuts).
 *
 * Command line
 *   sluice-stub [-l HOST:PORT] [-q] [--health-status CODE] [--slow-start SECONDS]
 *               [--busy] [--busy-status 429|503] [--busy-retry-after SECONDS]
 *               [--interval-scale F] [--batch N] [--prefix-cache BLOCKS]
 *               [--block BYTES] [--ttft-base-ms MS] [--ttft-ms-per-kib MS]
 *               [--prefill-mode independent|shared]
 *     -l  listen address, default 127.0.0.1:9000; "[::1]:PORT" for IPv6; port 0
 *         picks a free port.
 *     -q  quiet: no per-request log lines on stderr (startup errors still print).
 *   The rest let one stub play one replica of a pool (health, loading, busy):
 *     --health-status CODE  GET /health answers CODE, 200..599 but 204/304,
 *         default 200. Only /health changes: completions are still served.
 *     --slow-start SECONDS  0..86400, fraction allowed: "loading" for SECONDS
 *         after the listening line, like llama.cpp server loading a model.
 *     --busy                completions are refused (status below, Retry-After).
 *     --busy-status 429|503 the status of a busy refusal, default 503.
 *     --busy-retry-after N  0..86400, its Retry-After, default 2.
 *     --interval-scale F    multiply every X-Stub-Interval-Ms by F (decimal,
 *         0 < F <= 1000, default 1): a replica with F = 3 streams 3x slower.
 *   The last six make it a model runner with a batch and a prefix cache (see
 *   Runner model below); all are off by default:
 *     --batch N             0..100000, default 0 (no limit): at most N completions
 *         hold a slot at once, the others wait in a FIFO queue.
 *     --prefix-cache BLOCKS 0..4194304, default 0 (none): an LRU of that many
 *         prompt block hashes.
 *     --block BYTES         16..65536, default 64: prompt bytes per block.
 *     --ttft-base-ms MS, --ttft-ms-per-kib MS   0..86400 each, fraction allowed,
 *         default 0: a request's prefill lasts base + per-KiB x its uncached
 *         prompt bytes / 1024 ms.
 *     --prefill-mode independent|shared   default independent: every prefill
 *         is its own timer; shared: the per-KiB part of all prefills is served
 *         by one compute lane in FIFO order (see Runner model).
 *   Bad values print why and the usage, exit 2.
 *   After binding, exactly one line goes to stdout, flushed:
 *     sluice-stub listening on HOST:PORT        (numeric host, actual port)
 *   SIGTERM / SIGINT: free every connection and exit 0.
 *
 * Endpoints
 *   POST /v1/chat/completions, POST /v1/completions
 *       body contains "stream": true or "stream":true, or is a JSON object whose
 *       "stream" vLLM reads as true (pydantic's lax bool: 1, 1.0, "1", and "t",
 *       "y", "on", "yes", "true" in any case) -> SSE stream, else one JSON
 *       completion (Content-Length framed).
 *   POST /v1/responses  OpenAI's Responses API, stream or not ("stream" read as
 *                       above); see Responses below.
 *   GET /v1/responses/ID, DELETE /v1/responses/ID, POST /v1/responses/ID/cancel,
 *   GET /v1/responses/ID/input_items   a stored response (see Responses).
 *   POST /v1/messages   Anthropic's Messages API, stream or not; see Messages.
 *   POST /v1/messages/count_tokens     {"input_tokens":P}.
 *   POST /v1/embeddings JSON only; see Embeddings.
 *   GET|POST|PUT|DELETE /v1/echo[?query]
 *       {"method":..,"path":..,"query":..,"headers":[[name,value],..],"body":..}
 *   GET /v1/models      one model, "stub".
 *   GET /stub/stats     counters, below.
 *   GET /stub/prefills  the last (up to 4096) prefills since start or reset, oldest
 *                       first: {"prefills":[{"prompt_bytes","hit_bytes","queue_ms",
 *                       "lane_ms","prefill_ms","ttft_ms","slot_ms"},..]} (as in
 *                       last_prefill below), for a benchmark's tail analysis.
 *   GET /stub/last      the body of the last completion request (chat, completions,
 *                       responses, messages, embeddings) or count_tokens, byte
 *                       for byte, with "X-Stub-Path: PATH"; 404 if none since reset.
 *   POST /stub/reset    zero the counters, drop idle tags, forget the last body,
 *                       empty the prefix cache and the stored responses;
 *                       {"ok":true}.
 *   GET /metrics        Prometheus text (version 0.0.4) in vLLM's names, each with
 *                       # HELP, # TYPE gauge and the label model_name="stub":
 *                       vllm:num_requests_running (slots held), vllm:num_requests_waiting
 *                       (queued), vllm:kv_cache_usage_perc (prompt blocks of the
 *                       running requests / --prefix-cache, at most 1, as vLLM counts
 *                       blocks in use; 0 without a cache).
 *   GET /health         loading: 503 LOADING (below); else the health status:
 *                       2xx {"status":"ok"}, 503 LOADING, other {"error":{"message":
 *                       "stub health CODE","type":"stub","code":CODE}}.
 *   POST /stub/health?status=CODE      set the health status (as --health-status)
 *   POST /stub/busy?on=0|1[&status=429|503][&retry_after=N]   busy on/off; status
 *                       and retry_after stay as they are when not given
 *   POST /stub/slow-start?seconds=S    loading from now for S seconds; 0 ends it
 *       Control answers: 200 {"ok":true,MODE} with the modes after the change; an
 *       unknown, missing or bad parameter is 400 and changes nothing. MODE is
 *       "health_status":N,"busy":0|1,"busy_status":N,"busy_retry_after":N,
 *       "loading":0|1,"loading_left_ms":N. POST /stub/reset keeps the modes.
 *   anything else       404 {"error":{...}}.
 *   Loading and busy apply to the completions only (POST /v1/chat/completions,
 *   /v1/completions, /v1/responses, /v1/messages, /v1/embeddings; not
 *   count_tokens, not the stored-response paths), after the steering headers
 *   are checked (a bad one is still 400) and before any other knob (status,
 *   delay, hang are not applied). Loading wins over busy:
 *     loading: 503 LOADING = {"error":{"code":503,"message":"Loading model",
 *              "type":"unavailable_error"}} (llama.cpp's words, no Retry-After;
 *              the same on /v1/messages)
 *     busy:    STATUS, "Retry-After: N" after Content-Length, and
 *              {"error":{"message":"stub busy","type":"stub","code":STATUS}};
 *              on /v1/messages in Anthropic's shape, as vLLM's /v1/messages
 *              wraps its errors: {"type":"error","error":{"type":"stub",
 *              "message":"stub busy"}}
 *   Malformed HTTP gets 400 (413 body > 4 MiB, 414 URL > 8 KiB, 431 headers too
 *   large or > 100 of them) and the connection is closed. Upgrade/CONNECT: 400.
 *   HTTP/1.1 keep-alive with pipelining (answered in order); bodies (Content-Length
 *   or chunked) are read whole before answering; "Expect: 100-continue" is
 *   answered. HTTP/1.0, "Connection: close" and HEAD get "Connection: close" on
 *   JSON answers and the socket closes after the response (the SSE head is always
 *   the exact one below). A peer that closes or half-closes (EOF) while its
 *   request is being served counts as gone.
 *
 * Steering headers (names case-insensitive, values decimal, blanks trimmed; a value
 * that does not parse or is out of range gets 400 {"error":..} instead of being
 * ignored, so a typo cannot silently become a default; the last of duplicates
 * wins). They apply to every /v1/ path (including /v1/ 404s); /stub/ paths and
 * other paths ignore them.
 *   X-Stub-Events       0..100000000 (non-stream and /v1/responses: 0..1000000),
 *                       default 16
 *   X-Stub-Event-Size   0..8388608 target bytes per event, default 0 (natural size)
 *   X-Stub-Interval-Ms  0..3600000, default 20; 0 = as fast as the socket takes them
 *   X-Stub-Abort-After  0..100000000: after K events are written, close the socket
 *                       (FIN, no [DONE], no last chunk); 0 closes right after the
 *                       head; K == events cuts just before [DONE] (or the usage
 *                       chunk); K > events never fires (but K == events + 1 with
 *                       a usage chunk: after it). Non-stream: the head (with the full
 *                       Content-Length) is sent, then the close.
 *   X-Stub-Status       200..599 except 204 and 304 (they cannot carry the body):
 *                       completions answer {"error":{"message":"stub status CODE",
 *                       "type":"stub","code":CODE}} with that status (other
 *                       paths ignore it); /v1/messages answers {"type":"error",
 *                       "error":{"type":"stub","message":"stub status CODE"}}.
 *   X-Stub-Delay-Ms     0..3600000 wait before the response head (every /v1/ path)
 *   X-Stub-Hang         0..1: read the request, never answer, hold the connection
 *                       until the peer closes it (wins over everything but a 400)
 *   X-Stub-Tag          1..64 bytes, per-tag stats label, default "-"
 *   X-Stub-Stamp        0..1: add "t":<CLOCK_MONOTONIC ns> to each event
 *   X-Stub-Usage        P,C: the prompt and completion tokens usage reports
 *                       (decimal, 0..10^18-1 each). Without it P = ceil(request
 *                       body bytes / 4), C = X-Stub-Events (one token per event).
 *   X-Stub-Ignore-Usage 0..1: a runner that does not honour include_usage: the
 *                       stream carries no usage chunk (and a non-stream answer
 *                       no "usage" member).
 *   X-Stub-Model        0..1: every event names the model, "model":"stub", after
 *                       "object" (as vLLM names its served model in each chunk);
 *                       counts toward the size. Off by default.
 *   X-Stub-Usage-Null   0..1: when the usage chunk is sent, every event also ends
 *                       in ,"usage":null (as vLLM and OpenAI do). Off by default,
 *                       so that a gateway that injects include_usage and drops
 *                       the chunk relays the very bytes of a stream not asked.
 *   X-Stub-Cache-Tokens CC,CR: /v1/messages reports cache_creation_input_tokens
 *                       CC and cache_read_input_tokens CR (decimal, 0..10^18-1
 *                       each) in its usage (see Messages); other paths ignore it.
 *   On /v1/responses, /v1/messages and /v1/embeddings, X-Stub-Event-Size,
 *   X-Stub-Model and X-Stub-Usage-Null are ignored; the others apply as below.
 *
 * Usage. A completion body that is a JSON object with "stream_options":
 * {"include_usage":true} (parsed with jansson; any value vLLM reads as true,
 * as for "stream" above; 0, "false", "no" and the like are false) asks for
 * usage: counted in
 * include_usage_requests (global and per tag) whatever else happens to it.
 * A stream that asked (and no X-Stub-Ignore-Usage) has, after the last event and
 * before [DONE], one usage chunk (and with X-Stub-Usage-Null: 1 ,"usage":null
 * after "pad" in every event):
 *   data: {"id":"chatcmpl-stub","object":"chat.completion.chunk","created":0,
 *   "model":"stub","choices":[],"usage":{"prompt_tokens":P,"completion_tokens":C,
 *   "total_tokens":P+C}}\n\n
 * (on /v1/completions "id":"cmpl-stub","object":"text_completion"). For
 * X-Stub-Abort-After it is unit number events: K == events cuts before it,
 * K == events + 1 after it (before [DONE]). A non-stream answer always ends
 * with ,"usage":{...} (same numbers) after "choices".
 *
 * Stream framing (byte exact)
 *   HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n
 *   Transfer-Encoding: chunked\r\n\r\n
 *   then one chunk per event ("%x\r\n<event>\r\n"), the first at once, the next one
 *   X-Stub-Interval-Ms after the previous was fully handed to the kernel; then the
 *   chunk "data: [DONE]\n\n" and "0\r\n\r\n". Keep-alive goes on afterwards.
 *   Event i (0-based):
 *   data: {"id":"chatcmpl-stub","object":"chat.completion.chunk","seq":I,
 *   "choices":[{"index":0,"delta":{"content":"tokI "}}],"pad":"PAD"}\n\n
 *   (one line), where PAD is max(0, EVENT_SIZE - length of the event with PAD
 *   empty) 'x's. With X-Stub-Stamp: 1, ,"t":NANOS follows "seq":I and counts
 *   toward the size. On /v1/completions:
 *   data: {"id":"cmpl-stub","object":"text_completion","seq":I,
 *   "choices":[{"index":0,"text":"tokI "}],"pad":"PAD"}\n\n
 *   With usage asked for and X-Stub-Usage-Null: 1, "pad":"PAD","usage":null}
 *   ends each (see Usage).
 *   Non-stream: {"id":"chatcmpl-stub","object":"chat.completion","choices":[{"index":0,
 *   "message":{"role":"assistant","content":"tok0 tok1 ... "},"finish_reason":"stop"}],
 *   "usage":{"prompt_tokens":P,"completion_tokens":C,"total_tokens":P+C}}
 *
 * Responses (POST /v1/responses). The body is parsed with jansson. M is its
 * "model" string, JSON-escaped ("stub" when absent or not a string); E is
 * X-Stub-Events (0..1000000 here, stream or not: the last events carry the
 * whole text); TEXT is "tok0 tok1 ... tok(E-1) "; P and C are as for chat
 * (X-Stub-Usage, else P = ceil(body bytes / 4) and C = E). Ids: RID is
 * resp_PORT_PID_N and MID msg_PORT_PID_N, PORT the port listened on, PID the
 * stub's, N counting the 200 Responses and Messages answers of the process
 * from 1 (never reset): two stubs never make the same id, and an id names its
 * replica. RESPONSE(S, O, U) is
 *   {"id":"RID","object":"response","created_at":0,"status":"S",
 *   "background":false,"error":null,"incomplete_details":null,
 *   "instructions":I,"max_output_tokens":null,"model":M,"output":[O],
 *   "parallel_tool_calls":true,"previous_response_id":PREV,"reasoning":null,
 *   "store":STORE,"temperature":1.0,"text":{"format":{"type":"text"}},
 *   "tool_choice":"auto","tools":[],"top_p":1.0,"truncation":"disabled",
 *   "usage":U,"user":null,"metadata":{}}
 * where I is the body's "instructions" string (else null), PREV its
 * "previous_response_id" string (else null), and STORE false when its "store"
 * is false (read as "stream" is), else true. ITEM(S, CONTENT) is
 *   {"id":"MID","type":"message","status":"S","content":[CONTENT],
 *   "role":"assistant"}
 * PART(T) is {"type":"output_text","annotations":[],"logprobs":[],"text":"T"},
 * and USAGE is
 *   {"input_tokens":P,"input_tokens_details":{"cached_tokens":0},
 *   "output_tokens":C,"output_tokens_details":{"reasoning_tokens":0},
 *   "total_tokens":P+C}
 * or null with X-Stub-Ignore-Usage: 1. Non-stream: RESPONSE(completed,
 * ITEM(completed, PART(TEXT)), USAGE), Content-Length framed. Stream: the SSE
 * head of Stream framing, then one chunk per event, "event: TYPE\ndata: JSON\n\n"
 * with JSON on one line, {"type":"TYPE","sequence_number":K then (K from 0):
 *   0    response.created             ,"response":RESPONSE(in_progress,,null)}
 *   1    response.in_progress         ,"response":RESPONSE(in_progress,,null)}
 *   2    response.output_item.added   ,"output_index":0,"item":ITEM(in_progress,)}
 *   3    response.content_part.added  ,"item_id":"MID","output_index":0,
 *                                     "content_index":0,"part":PART()}
 *   4+i  response.output_text.delta   ,"item_id":"MID","output_index":0,
 *        (i = 0..E-1)                 "content_index":0,"delta":"toki ",
 *                                     "logprobs":[]}
 *   4+E  response.output_text.done    ,"item_id":"MID","output_index":0,
 *                                     "content_index":0,"text":"TEXT",
 *                                     "logprobs":[]}
 *   5+E  response.content_part.done   ,"item_id":"MID","output_index":0,
 *                                     "content_index":0,"part":PART(TEXT)}
 *   6+E  response.output_item.done    ,"output_index":0,"item":ITEM(completed,
 *                                     PART(TEXT))}
 *   7+E  response.completed           ,"response":RESPONSE(completed,
 *                                     ITEM(completed, PART(TEXT)), USAGE)}
 * then the last chunk "0\r\n\r\n": no [DONE] (OpenAI and vLLM send none on
 * /v1/responses). Members are in OpenAI's wire order; the item is there even
 * for E = 0. The first four go at once, the deltas X-Stub-Interval-Ms apart
 * (none before the first), the rest at once after the last delta. With
 * X-Stub-Stamp: 1 each delta has ,"t":NANOS right after "sequence_number":K.
 * X-Stub-Abort-After K counts the deltas only: 0 closes right after the HTTP
 * head (no event), K in 1..E right after the K-th delta (K == E: before
 * response.output_text.done), K > E never fires. Non-stream: the head (with
 * the full Content-Length), then the close, as for chat.
 *
 * Stored responses, kept in process memory as vLLM keeps them. A
 * /v1/responses answer whose body did not say "store": false is stored under
 * RID: its completed RESPONSE as sent (usage included), its input items and
 * its conversation text. A non-stream one is stored when built (even when
 * X-Stub-Abort-After then cuts it), a stream when its response.completed event
 * is built (a cut before it stores nothing). An LRU of at most 4096 responses
 * (and 256 MiB), refreshed by every lookup; POST /stub/reset empties it. A
 * body with a "previous_response_id" string is looked up after loading, busy
 * and X-Stub-Status (they win) and before the runner model. Not stored: 404
 *   {"error":{"message":"Response with id 'ID' not found.",
 *   "type":"invalid_request_error","param":"response_id","code":404}}
 * (vLLM's words; ID JSON-escaped), with no slot and no prefill. Stored: its
 * conversation text (its own prompt, then its TEXT) starts the follow-up's
 * prompt in the runner model, so a chain hits the prefix cache of the replica
 * that holds it. The paths (ID is one path segment as sent, not
 * percent-decoded; an ID not stored gets the 404 above; another method on
 * them is 404 not found):
 *   GET /v1/responses/ID              the stored object, 200
 *   POST /v1/responses/ID/cancel      the stored object, 200, unchanged (vLLM
 *                                     answers 400 for one not in background)
 *   DELETE /v1/responses/ID           {"id":"ID","object":"response.deleted",
 *                                     "deleted":true}, and it is forgotten
 *   GET /v1/responses/ID/input_items  {"object":"list","data":ITEMS,
 *                                     "first_id":F,"last_id":L,"has_more":false}
 * ITEMS: for an "input" string S, [{"type":"message","role":"user","content":
 * [{"type":"input_text","text":"S"}]}]; for an array, that array as jansson
 * writes it (JSON_COMPACT); else []. F and L are the "id" strings of its first
 * and last items (JSON strings), else null.
 *
 * Messages (POST /v1/messages, Anthropic's API). M, E, TEXT, P, C and MID as
 * for Responses, but E is 0..100000000 streamed (0..1000000 not). AUSAGE(O) is
 * "usage":{"input_tokens":P,"output_tokens":O}, or with X-Stub-Cache-Tokens
 * CC,CR "usage":{"input_tokens":P,"cache_creation_input_tokens":CC,
 * "cache_read_input_tokens":CR,"output_tokens":O}. Non-stream:
 *   {"id":"MID","type":"message","role":"assistant","model":M,"content":
 *   [{"type":"text","text":"TEXT"}],"stop_reason":"end_turn",
 *   "stop_sequence":null,AUSAGE(C)}
 * Stream: one chunk per event "event: TYPE\ndata: JSON\n\n", Anthropic's:
 *   message_start        {"type":"message_start","message":{"id":"MID",
 *                        "type":"message","role":"assistant","model":M,
 *                        "content":[],"stop_reason":null,"stop_sequence":null,
 *                        AUSAGE(1)}}
 *   content_block_start  {"type":"content_block_start","index":0,
 *                        "content_block":{"type":"text","text":""}}
 *   ping                 {"type": "ping"}  (with the blank, as Anthropic's)
 *   content_block_delta  {"type":"content_block_delta","index":0,"delta":
 *     (i = 0..E-1)       {"type":"text_delta","text":"toki "}}
 *   content_block_stop   {"type":"content_block_stop","index":0}
 *   message_delta        {"type":"message_delta","delta":{"stop_reason":
 *                        "end_turn","stop_sequence":null},"usage":
 *                        {"output_tokens":C}}
 *   message_stop         {"type":"message_stop"}
 * then "0\r\n\r\n" (no [DONE]). Pacing, X-Stub-Stamp (,"t":NANOS right after
 * "index":0 of each delta) and X-Stub-Abort-After (counting the deltas; K == E
 * cuts before content_block_stop) as for Responses. X-Stub-Ignore-Usage: 1, a
 * runner that reports none: no ,AUSAGE(..) in message_start nor in the JSON
 * answer, and message_delta without ,"usage":{..}. (vLLM's own /v1/messages
 * stream differs from Anthropic's: no ping, the usage beside "message" in
 * message_start, "data: [DONE]" after message_stop. The stub sends Anthropic's.)
 * POST /v1/messages/count_tokens answers {"input_tokens":P}, P as above (not a
 * completion: no runner model, X-Stub-Status, loading or busy).
 *
 * Embeddings (POST /v1/embeddings, JSON only; "stream" and X-Stub-Events are
 * ignored). The body's "input" is a string (one input, N its bytes), an array
 * of integers (one token array, N its length), or an array of strings and
 * token arrays (one input each, N its bytes or length). Anything else, or a
 * body that is not a JSON object, is 400 {"error":{"message":"bad input: want a
 * string, a token array, or an array of strings or token arrays","type":"stub",
 * "code":400}} (after loading, busy and X-Stub-Status, before the runner
 * model). Input i (from 0) has EMB = [N.0,i.0,0.5,-0.25], or with
 * "encoding_format":"base64" (which the OpenAI SDKs ask for by default) those
 * four as little-endian float32, base64:
 *   {"object":"list","data":[{"object":"embedding","embedding":EMB,"index":i},
 *   ..],"model":M,"usage":{"prompt_tokens":P,"total_tokens":P}}
 * P is X-Stub-Usage's first number, else ceil(body bytes / 4);
 * X-Stub-Ignore-Usage: 1 drops ,"usage":{..}. X-Stub-Abort-After: the head,
 * then the close.
 *
 * Runner model. A completion the stub will answer 200 (chat, completions,
 * responses, messages or embeddings, stream or not, no X-Stub-Status; not one
 * refused as loading or busy, nor a /v1/responses 404 or /v1/embeddings 400
 * above) first takes one of
 * --batch slots, or waits for one in FIFO order; then it prefills; then the other
 * knobs apply (X-Stub-Hang, X-Stub-Delay-Ms) and the response starts, so the time
 * to the head (and the first event) is wait + prefill (+ delay). The slot is held
 * until the response is written or the peer leaves. The prompt is the body's
 * messages[].content concatenated (a content array contributes its strings and
 * "text" parts), or its "prompt" (a string or an array of strings), as decoded
 * bytes; on /v1/messages its "system" (likewise) comes first; on /v1/responses
 * it is the stored conversation of its previous_response_id, its
 * "instructions", then its "input" (a string, or items: strings and the
 * "content" of objects, likewise); on /v1/embeddings its "input" strings. A
 * body jansson cannot parse has an empty prompt. It is cut into blocks
 * of --block bytes (the tail after the last whole block is never cached), each
 * hashed with the hash of the blocks before it (FNV-1a 64, chained). When the
 * request gets its slot, its cached prefix is the longest run of its leading
 * blocks found in the LRU (refreshed then, last block first), and prefill =
 * base + per_kib x (prompt bytes - cached blocks x block) / 1024 ms. When the
 * prefill ends, all its blocks are inserted
 * (or refreshed) in the LRU, last block first, so a shared head is evicted last.
 * With every runner option off a completion takes its slot and prefills in zero
 * time within the same step: answers and timing are as they were.
 *
 * Prefill compute (--prefill-mode). independent (the default): each prefill is
 * its own timer, so prefills on one replica run fully in parallel and a long
 * uncached prompt delays only itself. shared: the per-KiB part of the prefill
 * (the compute, per_kib x uncached KiB) is served by one lane per process in
 * the order slots were given (FIFO): a prefill's compute starts when the one
 * before it ends, and its first token is due `base` ms after its own compute
 * ends (base is per-request latency the batch shares, not extra compute: 8
 * fully cached requests given slots at once all get TTFT = base). So two
 * uncached prompts of w1 and w2 ms given slots together: TTFT w1 + base and
 * w1 + w2 + base. A request that leaves mid-prefill gives the rest of its
 * compute back: those behind it move up. Why FIFO and not processor sharing:
 * vLLM's scheduler (v1, chunked prefill) fills each step's token budget
 * (max_num_batched_tokens) from its running requests in arrival order, each
 * taking min(tokens left, budget left); a long prompt ahead therefore takes
 * whole steps until its last chunk, and the next request's prefill only gets
 * the remainder, which is first-come first-served compute, not an even split
 * (that would need long_prefill_token_threshold / partial-prefill limits,
 * off by default); SGLang's chunked prefill also runs one chunked request at a
 * time. Decode (the --batch slots and the pacing of events) is not part of the
 * lane: it stays as in independent mode. Slots (running/waiting) mean the same
 * in both modes: a request in the lane holds its slot and counts as running,
 * as vLLM counts a request in chunked prefill.
 *
 * Stats (GET /stub/stats)
 *   {"requests","streams_started","streams_completed","aborted_by_client","inflight",
 *    "max_inflight","blocked_writes","bytes_sent","connections_open",
 *    "connections_total","health_requests","busy_rejected","loading_rejected",
 *    "include_usage_requests","usage_chunks",RESPONSES,RUNNER,
 *    MODE,"tags":{"TAG":{"requests","inflight","max_inflight",
 *    "completed","aborted_by_client","bytes_sent","include_usage_requests"}}}
 *   usage_chunks counts usage chunks built (a cut may lose one written), on chat
 *   and completions only; include_usage_requests too.
 *   RESPONSES is the stored responses' counters (and one gauge):
 *     "responses_stored"     responses stored
 *     "responses_held"       stored now (a gauge, at most 4096)
 *     "responses_evicted","responses_deleted"   dropped by the LRU, by DELETE
 *     "previous_found","previous_missing"   previous_response_id lookups (the
 *                            missing ones answered 404)
 *     "retrieve_found","retrieve_missing"   GET, DELETE, cancel and input_items
 *                            of an ID stored / not stored
 *   requests/inflight count /v1/ requests only (not /stub/ paths, not other 404s, not
 *   malformed HTTP): in flight from the moment the request is fully read until its
 *   response is fully written or its connection closes. completed (per tag) = whole
 *   response written. aborted_by_client = the peer closed (EOF, ECONNRESET, EPIPE)
 *   before that. A stub-made cut (Abort-After) is neither. blocked_writes counts every
 *   EAGAIN from a client write; bytes_sent counts head + body bytes of /v1/ responses.
 *   max_inflight is sampled once the events of a loop iteration are all handled, so a
 *   close and a new request seen in one iteration are never counted as overlapping
 *   (libev runs them last-ready first); a request that starts and ends within one
 *   iteration is not seen by it.
 *   health_requests counts GET /health (never in requests). busy_rejected and
 *   loading_rejected count refused completions; those are /v1/ requests, so they
 *   are in requests (and their tag) too: requests - busy_rejected -
 *   loading_rejected is what the stub accepted to serve.
 *   Reset keeps the gauges (inflight, connections_open), sets max_inflight to
 *   inflight, and keeps tags that still have requests in flight (counters zeroed).
 *   RUNNER is the runner model's settings, gauges and counters:
 *     "runner":{"batch","prefix_cache","block","ttft_base_ms","ttft_ms_per_kib",
 *       "prefill_mode":"independent"|"shared"},
 *     "running","waiting"    slots held, requests queued (gauges)
 *     "prefilling"           of the running, those whose prefill has not ended
 *     "lane_backlog_ms"      shared mode: compute queued in the lane from now
 *     "max_running","max_waiting"   their peaks since start or reset
 *     "prefills"             prefills ended
 *     "prompt_bytes","prompt_bytes_hit"   prompt bytes of the requests given a
 *                            slot, and of those the bytes in cached blocks
 *     "prompt_blocks","prefix_hit_blocks","prefix_hit_requests"   their whole
 *                            blocks, those found cached, requests with any found
 *     "cache_blocks","cache_evictions"   blocks in the LRU now, evicted so far
 *     "queue_ms_total","prefill_ms_total","lane_ms_total"   summed slot waits
 *                            (measured), modelled prefills and lane waits, ms
 *     "last_prefill":null or {"prompt_bytes","blocks","hit_blocks","hit_bytes",
 *       "queue_ms","lane_ms","prefill_ms","ttft_ms","slot_ms"} of the last
 *       prefill that ended: queue_ms measured from dispatch to slot; lane_ms
 *       modelled wait for the compute lane (0 in independent mode); prefill_ms
 *       modelled (base + per-KiB x uncached KiB); ttft_ms measured from
 *       dispatch to the prefill's end (the response may start); slot_ms the
 *       CLOCK_MONOTONIC time the slot was given, ms (relates two prefills).
 *   Reset empties the LRU, zeroes the counters (evictions too), drops
 *   last_prefill and sets the peaks to the gauges.
 *
 * Flow control is the point of this program: at most one unit (a head, one event,
 * or one whole JSON response) waits in user space per connection. When a write
 * returns EAGAIN nothing more is produced until the socket drains, so a reader
 * that stops reading stops the stub, and bytes_sent shows it.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/queue.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <ev.h>
#include <http_parser.h>
#include <jansson.h>

#define STUB_DEFAULT_LISTEN "127.0.0.1:9000"
#define LISTEN_BACKLOG      4096
#define ACCEPTS_PER_PASS    64
#define READS_PER_PASS      4
/* Steps of the state machine per wake-up; one fast stream must not starve the rest. */
#define DRIVE_BUDGET        192

#define IN_CAP              (64 * 1024)         /* pipelined bytes kept while serving */
#define ARENA_CAP           (96 * 1024)         /* URL + header bytes of one request */
#define URL_CAP             (8 * 1024)
#define BODY_CAP            (4 * 1024 * 1024)
#define MAX_HEADERS         100
/* Worst case is /v1/echo with every body byte escaped as \u00XX. */
#define OUT_CAP             (6 * BODY_CAP + 6 * ARENA_CAP + 4096)
#define OUT_KEEP            (64 * 1024)         /* larger out buffers are freed when idle */
#define REQ_KEEP            (16 * 1024)
#define HEAD_ROOM           256                 /* room before a JSON body for its head */
#define CHUNK_ROOM          16                  /* room before an event for "%x\r\n" */
#define TAG_MAX_LEN         64
#define MAX_TAGS            10000
#define NONSTREAM_MAX_EVENTS 1000000LL
/* The runner model: --batch, --prefix-cache, --block. */
#define BATCH_MAX           100000LL
#define PC_MAX_BLOCKS       4194304LL
#define BLOCK_MIN           16LL
#define BLOCK_MAX           65536LL
#define BLOCK_DEFAULT       64
#define PC_NIL              UINT32_MAX
#define PREFILL_RING        4096                /* GET /stub/prefills keeps these */

/* ------------------------------------------------------------------ buffers */

/*
 * A growable byte buffer with a hard cap. Appends that would pass the cap or fail
 * to allocate set a sticky err, so a builder checks once at the end.
 */
struct buf {
	char	*data;
	size_t	 len;
	size_t	 cap;
	size_t	 max;
	int	 err;
};

static void
buf_init(struct buf *b, size_t max)
{
	memset(b, 0, sizeof *b);
	b->max = max;
}

static void
buf_free(struct buf *b)
{
	free(b->data);
	b->data = NULL;
	b->len = b->cap = 0;
	b->err = 0;
}

/* Make room for extra more bytes; -1 (and err set) past the cap or out of memory. */
static int
buf_reserve(struct buf *b, size_t extra)
{
	size_t need, ncap;
	char *p;

	if (b->err)
		return -1;
	if (extra > b->max - b->len) {
		b->err = 1;
		return -1;
	}
	need = b->len + extra;
	if (need <= b->cap)
		return 0;
	ncap = b->cap ? b->cap : 1024;
	while (ncap < need)
		ncap *= 2;
	if (ncap > b->max)
		ncap = b->max;
	if ((p = realloc(b->data, ncap)) == NULL) {
		b->err = 1;
		return -1;
	}
	b->data = p;
	b->cap = ncap;
	return 0;
}

static void
buf_append(struct buf *b, const void *p, size_t n)
{
	if (n == 0 || buf_reserve(b, n) < 0)
		return;
	memcpy(b->data + b->len, p, n);
	b->len += n;
}

static void
buf_puts(struct buf *b, const char *s)
{
	buf_append(b, s, strlen(s));
}

static void
buf_fill(struct buf *b, int ch, size_t n)
{
	if (n == 0 || buf_reserve(b, n) < 0)
		return;
	memset(b->data + b->len, ch, n);
	b->len += n;
}

static void buf_printf(struct buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void
buf_printf(struct buf *b, const char *fmt, ...)
{
	va_list ap;
	char tmp[256];
	int n;

	va_start(ap, fmt);
	n = vsnprintf(tmp, sizeof tmp, fmt, ap);
	va_end(ap);
	/* Only short numeric fragments go through here. */
	if (n < 0 || (size_t)n >= sizeof tmp) {
		b->err = 1;
		return;
	}
	buf_append(b, tmp, (size_t)n);
}

/* Append s as a JSON string: quote, backslash and C0 controls escaped, the rest raw. */
static void
buf_json_str(struct buf *b, const char *s, size_t n)
{
	static const char hex[] = "0123456789abcdef";
	size_t i, need = 2;
	char *o;

	for (i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)s[i];
		need += ch == '"' || ch == '\\' ? 2 : ch < 0x20 ? 6 : 1;
	}
	if (buf_reserve(b, need) < 0)
		return;
	o = b->data + b->len;
	*o++ = '"';
	for (i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)s[i];
		if (ch == '"' || ch == '\\') {
			*o++ = '\\';
			*o++ = (char)ch;
		} else if (ch < 0x20) {
			memcpy(o, "\\u00", 4);
			o += 4;
			*o++ = hex[ch >> 4];
			*o++ = hex[ch & 15];
		} else
			*o++ = (char)ch;
	}
	*o++ = '"';
	b->len = (size_t)(o - b->data);
}

/* Drop the first n bytes (already parsed). */
static void
buf_consume(struct buf *b, size_t n)
{
	if (n >= b->len) {
		b->len = 0;
		return;
	}
	memmove(b->data, b->data + n, b->len - n);
	b->len -= n;
}

/* ------------------------------------------------------------------ context */

struct tag {
	TAILQ_ENTRY(tag) entry;
	char	 name[TAG_MAX_LEN + 1];
	uint64_t requests, inflight, max_inflight, completed, aborted_by_client, bytes_sent;
	uint64_t include_usage_requests;
};
TAILQ_HEAD(tag_list, tag);

struct stats {
	uint64_t requests, streams_started, streams_completed, aborted_by_client;
	uint64_t inflight, max_inflight, blocked_writes, bytes_sent;
	uint64_t connections_open, connections_total;
	uint64_t health_requests, busy_rejected, loading_rejected;
	uint64_t include_usage_requests, usage_chunks;
	/* Stored responses (/v1/responses). */
	uint64_t responses_stored, responses_evicted, responses_deleted;
	uint64_t previous_found, previous_missing, retrieve_found, retrieve_missing;
};

/*
 * A stored response (vLLM keeps them in process memory): the final response
 * object, its input items and the conversation text so far (its prompt and
 * its output), which a follow-up's prompt starts with. A bounded LRU, hashed
 * by id.
 */
struct rs_ent {
	TAILQ_ENTRY(rs_ent) lru;	/* mru first */
	struct rs_ent	*hnext;		/* bucket chain */
	char		*id, *obj, *items, *first_id, *last_id, *context;
	size_t		 idlen, objlen, itemslen, ctxlen, bytes;
};
TAILQ_HEAD(rs_list, rs_ent);

#define RS_MAX		4096			/* stored responses kept */
#define RS_MAX_BYTES	(256u * 1024 * 1024)	/* and their bytes */
#define RS_BUCKETS	8192
#define RS_CTX_CAP	(16 * 1024 * 1024)	/* conversation text kept per response */

/* ------------------------------------------------------------------ prefix cache */

/*
 * The --prefix-cache LRU: a fixed table of chained block hashes, allocated at
 * startup, so a runner's KV-cache occupancy is "used / cap". Entries are
 * indices; PC_NIL ends a bucket chain or the LRU list. Only whole blocks are
 * cached: a prompt's hash i covers its first (i + 1) blocks (see prompt_feed),
 * so a hit on block i implies the prefix before it.
 */
struct pc_ent {
	uint64_t hash;
	uint32_t chain;		/* next entry of its bucket */
	uint32_t newer, older;	/* LRU list, mru first */
};

struct pcache {
	struct pc_ent	*ent;		/* cap entries; [0, used) in use */
	uint32_t	*bucket;	/* mask + 1 chain heads */
	uint32_t	 cap, used, mask;
	uint32_t	 mru, lru;
	uint64_t	 evictions;
};

/* Size the table for cap blocks (0: no cache). Startup only: dies without memory. */
static void pc_init(struct pcache *pc, uint32_t cap);

static uint32_t
pc_find(const struct pcache *pc, uint64_t h)
{
	uint32_t i;

	if (pc->cap == 0)
		return PC_NIL;
	for (i = pc->bucket[h & pc->mask]; i != PC_NIL; i = pc->ent[i].chain)
		if (pc->ent[i].hash == h)
			return i;
	return PC_NIL;
}

static void
pc_unlink_lru(struct pcache *pc, uint32_t i)
{
	struct pc_ent *e = &pc->ent[i];

	if (e->newer != PC_NIL)
		pc->ent[e->newer].older = e->older;
	else
		pc->mru = e->older;
	if (e->older != PC_NIL)
		pc->ent[e->older].newer = e->newer;
	else
		pc->lru = e->newer;
}

static void
pc_link_mru(struct pcache *pc, uint32_t i)
{
	struct pc_ent *e = &pc->ent[i];

	e->newer = PC_NIL;
	e->older = pc->mru;
	if (pc->mru != PC_NIL)
		pc->ent[pc->mru].newer = i;
	else
		pc->lru = i;
	pc->mru = i;
}

/* Insert h as the most recent block, or refresh it; a full cache evicts its lru. */
static void
pc_insert(struct pcache *pc, uint64_t h)
{
	uint32_t i, *p;

	if (pc->cap == 0)
		return;
	if ((i = pc_find(pc, h)) != PC_NIL) {
		pc_unlink_lru(pc, i);
		pc_link_mru(pc, i);
		return;
	}
	if (pc->used < pc->cap)
		i = pc->used++;
	else {
		i = pc->lru;
		pc_unlink_lru(pc, i);
		for (p = &pc->bucket[pc->ent[i].hash & pc->mask]; *p != i; p = &pc->ent[*p].chain)
			;
		*p = pc->ent[i].chain;
		pc->evictions++;
	}
	pc->ent[i].hash = h;
	pc->ent[i].chain = pc->bucket[h & pc->mask];
	pc->bucket[h & pc->mask] = i;
	pc_link_mru(pc, i);
}

/* Forget every block (POST /stub/reset). */
static void
pc_clear(struct pcache *pc)
{
	if (pc->cap > 0)
		memset(pc->bucket, 0xff, ((size_t)pc->mask + 1) * sizeof *pc->bucket);
	pc->used = 0;
	pc->mru = pc->lru = PC_NIL;
	pc->evictions = 0;
}

static void
pc_free(struct pcache *pc)
{
	free(pc->ent);
	free(pc->bucket);
	memset(pc, 0, sizeof *pc);
}

/* Counters of the runner model; POST /stub/reset zeroes them (not the gauges). */
struct runner_stats {
	uint64_t prefills;		/* prefills that ended (first token due) */
	uint64_t prompt_bytes;		/* prompt bytes of requests given a slot */
	uint64_t prompt_bytes_hit;	/* of which found in the prefix cache */
	uint64_t prompt_blocks;		/* whole blocks of those prompts */
	uint64_t hit_blocks;		/* of which found in the prefix cache */
	uint64_t hit_requests;		/* requests with at least one block found */
	uint64_t max_running, max_waiting;
	double	 queue_ms_total, prefill_ms_total, lane_ms_total;
};

/* What the last prefill was, for a test to check the model's arithmetic. */
struct last_prefill {
	int	 valid;
	uint64_t prompt_bytes, blocks, hit_blocks, hit_bytes;
	double	 queue_ms, lane_ms, prefill_ms, ttft_ms, slot_ms;
};

/* One ended prefill, for GET /stub/prefills. */
struct prefill_rec {
	uint64_t prompt_bytes, hit_bytes;
	double	 queue_ms, lane_ms, prefill_ms, ttft_ms, slot_ms;
};

struct conn;
LIST_HEAD(conn_list, conn);
TAILQ_HEAD(conn_queue, conn);

/* The one context of the process; every callback reaches it through its conn. */
struct stub {
	struct ev_loop	*loop;
	int		 quiet;
	int		 lfd;
	ev_io		 accept_w;
	ev_timer	 accept_retry;	/* after EMFILE: accept again later */
	ev_signal	 sigterm_w, sigint_w;
	struct conn_list conns;
	struct tag_list	 tags;
	size_t		 ntags;
	struct stats	 st;
	ev_prepare	 peak_w;	/* max_inflight, once the iteration's events are in */
	int		 peak_dirty;
	/* Replica modes: set on the command line, flipped by POST /stub/... */
	int		 health_status;	/* what GET /health answers once loaded */
	int		 busy;		/* refuse completions with busy_status */
	int		 busy_status;	/* 503 or 429 */
	long long	 busy_retry_after;	/* Retry-After seconds on a busy refusal */
	double		 loading_until;	/* CLOCK_MONOTONIC s; loading (503) before it */
	double		 interval_scale;	/* --interval-scale: pause = interval x this */
	/* The runner model (--batch, --prefix-cache, --block, --ttft-*). */
	long long	 batch;		/* slots; 0: unbounded */
	size_t		 block;		/* prompt bytes per cached block */
	double		 ttft_base_ms, ttft_ms_per_kib;
	uint64_t	 running;	/* completions holding a slot */
	uint64_t	 running_blocks;	/* their prompts' blocks (KV in use) */
	uint64_t	 waiting;	/* in waitq */
	struct conn_queue waitq;	/* completions waiting for a slot, FIFO */
	int		 prefill_shared;	/* --prefill-mode shared: one compute lane */
	double		 lane_free;	/* CLOCK_MONOTONIC s when the lane's work ends */
	struct conn_queue laneq;	/* shared: prefills not ended, in lane order */
	uint64_t	 prefilling;	/* slots whose prefill has not ended */
	struct pcache	 pc;
	struct runner_stats rs;
	struct last_prefill last_prefill;
	struct prefill_rec ring[PREFILL_RING];	/* the last prefills, a ring */
	size_t		 ring_n, ring_next;	/* records held; where the next goes */
	int		 stopping;	/* shutdown: hand no slot on */
	/* Stored responses: LRU list, hash buckets, count and bytes held. */
	struct rs_list	 rs_lru;
	struct rs_ent	*rs_bucket[RS_BUCKETS];
	size_t		 rs_n, rs_bytes;
	uint64_t	 id_seq;	/* ids made: resp_/msg_PORT_PID_N, never reset */
	unsigned	 port;		/* the port listened on, for those ids */
	/* GET /stub/last: the body of the last completion request, as received. */
	struct buf	 last_body;
	char		 last_path[32];	/* its path; "" when there is none */
	char		 scratch[IN_CAP];	/* socket reads land here, then the parser */
};

static void stub_log(const struct stub *ctx, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void
stub_log(const struct stub *ctx, const char *fmt, ...)
{
	va_list ap;

	if (ctx->quiet)
		return;
	va_start(ap, fmt);
	fputs("sluice-stub: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* Startup failures only. */
static void
die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fputs("sluice-stub: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	exit(1);
}

/*
 * Find or create the stats row for a tag. NULL when the table is full or out of
 * memory. Rows live until a reset finds them idle, so a request may keep a pointer.
 */
static struct tag *
tag_get(struct stub *ctx, const char *name, size_t len)
{
	struct tag *t;

	TAILQ_FOREACH(t, &ctx->tags, entry)
		if (strlen(t->name) == len && memcmp(t->name, name, len) == 0)
			return t;
	if (ctx->ntags >= MAX_TAGS || (t = calloc(1, sizeof *t)) == NULL)
		return NULL;
	memcpy(t->name, name, len);
	t->name[len] = '\0';
	TAILQ_INSERT_TAIL(&ctx->tags, t, entry);
	ctx->ntags++;
	return t;
}

static void
tags_free(struct stub *ctx)
{
	struct tag *t;

	while ((t = TAILQ_FIRST(&ctx->tags)) != NULL) {
		TAILQ_REMOVE(&ctx->tags, t, entry);
		free(t);
	}
	ctx->ntags = 0;
}

/* ------------------------------------------------------------------ requests */

/* The knobs a request sets through X-Stub-* headers; table-driven below. */
struct knobs {
	long long events, event_size, interval_ms, abort_after, status, delay_ms, hang, stamp;
	long long ignore_usage, usage_null, model;
	long long prompt_tokens, completion_tokens;	/* X-Stub-Usage; -1: not given */
	long long cache_creation, cache_read;	/* X-Stub-Cache-Tokens; -1: not given */
};

static const struct knob_def {
	const char	*name;
	long long	 min, max, def;	/* def may lie outside [min,max]: "unset" */
	size_t		 off;
} knob_defs[] = {
	{ "X-Stub-Events",	0, 100000000, 16, offsetof(struct knobs, events) },
	{ "X-Stub-Event-Size",	0, 8 * 1024 * 1024, 0, offsetof(struct knobs, event_size) },
	{ "X-Stub-Interval-Ms",	0, 3600000, 20, offsetof(struct knobs, interval_ms) },
	{ "X-Stub-Abort-After",	0, 100000000, -1, offsetof(struct knobs, abort_after) },
	{ "X-Stub-Status",	200, 599, 0, offsetof(struct knobs, status) },
	{ "X-Stub-Delay-Ms",	0, 3600000, 0, offsetof(struct knobs, delay_ms) },
	{ "X-Stub-Hang",	0, 1, 0, offsetof(struct knobs, hang) },
	{ "X-Stub-Stamp",	0, 1, 0, offsetof(struct knobs, stamp) },
	{ "X-Stub-Ignore-Usage", 0, 1, 0, offsetof(struct knobs, ignore_usage) },
	{ "X-Stub-Usage-Null",	0, 1, 0, offsetof(struct knobs, usage_null) },
	{ "X-Stub-Model",	0, 1, 0, offsetof(struct knobs, model) },
};
#define NKNOBS (sizeof knob_defs / sizeof knob_defs[0])

enum route {
	ROUTE_BAD,		/* malformed HTTP: 4xx, then close */
	ROUTE_KNOB_ERROR,	/* well-formed, but an X-Stub-* value is wrong: 400 */
	ROUTE_CHAT,
	ROUTE_COMPLETIONS,
	ROUTE_RESPONSES,	/* POST /v1/responses */
	ROUTE_MESSAGES,		/* POST /v1/messages (Anthropic) */
	ROUTE_EMBEDDINGS,	/* POST /v1/embeddings */
	ROUTE_COUNT_TOKENS,	/* POST /v1/messages/count_tokens */
	ROUTE_RESP_GET,		/* GET /v1/responses/{id} */
	ROUTE_RESP_DELETE,	/* DELETE /v1/responses/{id} */
	ROUTE_RESP_CANCEL,	/* POST /v1/responses/{id}/cancel */
	ROUTE_RESP_ITEMS,	/* GET /v1/responses/{id}/input_items */
	ROUTE_RESP_MISSING,	/* POST /v1/responses, previous_response_id not stored */
	ROUTE_BAD_INPUT,	/* POST /v1/embeddings without a usable "input" */
	ROUTE_ECHO,
	ROUTE_MODELS,
	ROUTE_STATS,
	ROUTE_RESET,
	ROUTE_LAST,		/* GET /stub/last */
	ROUTE_PREFILLS,		/* GET /stub/prefills */
	ROUTE_HEALTH,		/* GET /health */
	ROUTE_METRICS,		/* GET /metrics: the runner's gauges, vLLM's names */
	ROUTE_CTL_HEALTH,	/* POST /stub/health?status=CODE */
	ROUTE_CTL_BUSY,		/* POST /stub/busy?on=0|1[&status=..][&retry_after=..] */
	ROUTE_CTL_SLOW_START,	/* POST /stub/slow-start?seconds=S */
	ROUTE_BUSY,		/* a completion refused: the stub is busy */
	ROUTE_LOADING,		/* a completion refused: the stub is loading */
	ROUTE_NOT_FOUND
};

struct hdr {
	uint32_t name_off, name_len, val_off, val_len;	/* into req.arena */
};

enum last_cb { LAST_NONE, LAST_FIELD, LAST_VALUE };

/* One request, filled by the parser callbacks, judged at dispatch. */
struct req {
	struct buf	 arena;		/* URL first, then header names and values */
	size_t		 url_len;
	struct hdr	 hdrs[MAX_HEADERS];
	unsigned	 nhdr;
	enum last_cb	 last;
	struct buf	 body;
	int		 err_status;	/* a callback refused input: 413/414/431 */
	unsigned	 method;
	unsigned	 started:1, complete:1, keep_alive:1;
	unsigned	 expect_continue:1, continue_sent:1;

	/* Set at dispatch. */
	enum route	 route;
	struct knobs	 k;
	int		 stream;
	int		 include_usage;	/* body: "stream_options":{"include_usage":true} */
	int		 stream_lax;	/* body: a JSON object whose "stream" vLLM takes for true */
	int		 send_usage;	/* stream ends with a usage chunk */
	long long	 prompt_tokens, completion_tokens;	/* what usage reports */
	int		 status;	/* what we answer, for the log */
	char		 errmsg[96];	/* ROUTE_BAD / ROUTE_KNOB_ERROR */
	char		 extra_head[48];	/* one more header line for a JSON head */
	unsigned	 dispatched:1;	/* finish it exactly once */
	unsigned	 counted:1;	/* holds one unit of inflight */
	struct tag	*tag;

	/* The runner model, for a completion it serves (see runner_admit). */
	enum { SLOT_NONE, SLOT_WAITING, SLOT_RUNNING } slot;
	size_t		 prompt_bytes;	/* messages[].content or prompt, decoded */
	uint64_t	*blocks;	/* chained hashes of its whole blocks; owned here,
					   freed by req_reset / conn_free */
	size_t		 nblocks;
	size_t		 hit_blocks;	/* leading blocks found in the cache */
	double		 t_dispatch, t_slot;	/* CLOCK_MONOTONIC s */
	double		 prefill_ms;	/* modelled: base + per-KiB x uncached KiB */
	/* --prefill-mode shared: its place in the compute lane. */
	int		 in_lane;	/* in ctx->laneq */
	unsigned	 prefilling:1;	/* counted in ctx->prefilling */
	double		 work_ms;	/* its compute: per-KiB x uncached KiB */
	double		 t_lane_start, t_lane_end;	/* CLOCK_MONOTONIC s */

	/* Responses, Messages, embeddings: what the body said, set at dispatch. */
	enum route	 api;		/* the route asked for (route may become BUSY) */
	char		*model;		/* "model" string, owned; NULL: "stub" */
	size_t		 model_len;
	char		*instructions;	/* Responses "instructions" string, owned */
	size_t		 instr_len;
	char		*prev_id;	/* "previous_response_id" string, owned */
	size_t		 prev_len;
	int		 prev_found;	/* it is stored */
	int		 store;		/* Responses: keep it (no "store": false) */
	char		*items;		/* Responses: its input items, a JSON array */
	size_t		 items_len;
	char		*first_id, *last_id;	/* JSON values of their first/last "id" */
	struct buf	 context;	/* Responses: the conversation text of its prompt */
	char		*emb;		/* embeddings: the "data" array, built */
	size_t		 emb_len;
	int		 emb_base64;	/* "encoding_format": "base64" */
	unsigned long long id_n;	/* the N of its ids */
	size_t		 id_off, id_len;	/* /v1/responses/{id}: the id, in arena */
};

enum outcome { OUT_COMPLETED, OUT_ABORTED_BY_CLIENT, OUT_CUT, OUT_SHUTDOWN };

/* ------------------------------------------------------------------ connections */

/*
 * The connection state machine. conn_drive() is the only place that moves it;
 * libev callbacks note what happened (timer fired, socket writable) and call it.
 */
enum conn_state {
	CONN_READ,	/* parsing requests; EV_READ wakes us */
	CONN_DISPATCH,	/* a request is complete: pick route and knobs */
	CONN_QUEUED,	/* a completion waits for a --batch slot (ctx->waitq) */
	CONN_PREFILL,	/* holds a slot: the modelled TTFT timer */
	CONN_DELAY,	/* X-Stub-Delay-Ms timer before the head */
	CONN_HANG,	/* X-Stub-Hang: wait for the peer to give up */
	CONN_RESPOND,	/* build the head (and a small body) into out */
	CONN_WRITE,	/* flush out; EV_WRITE wakes us when the socket was full */
	CONN_PACE,	/* interval timer before the next event */
	CONN_EMIT,	/* build the next event, or the [DONE] trailer */
	CONN_DONE,	/* response written and accounted: next request or close */
	CONN_CLOSING	/* free at the top of the machine, never inside a library call */
};

enum resp_kind { RESP_NONE, RESP_CONTINUE, RESP_FIXED, RESP_CUT_AFTER_HEAD, RESP_STREAM };

struct conn {
	LIST_ENTRY(conn) entry;
	TAILQ_ENTRY(conn) wentry;	/* in ctx->waitq while CONN_QUEUED */
	TAILQ_ENTRY(conn) lentry;	/* in ctx->laneq while its lane work is due */
	struct stub	*ctx;
	int		 fd;
	enum conn_state	 state;
	enum outcome	 close_outcome;
	ev_io		 rio, wio;
	ev_timer	 timer;		/* delay, pacing, and yielding */
	http_parser	 parser;
	struct buf	 in;		/* pipelined bytes not yet parsed */
	struct buf	 out;		/* the one unit being written */
	size_t		 out_pos;
	int		 rio_stopped;	/* in is full: stop reading until served */
	struct req	 req;
	enum resp_kind	 kind;
	long long	 events_sent;
	int		 usage_sent;	/* the usage chunk is written (counts as a unit) */
	int		 trailer_sent;
	/* Responses / Messages streams: event units written, the last a token. */
	long long	 units;
	int		 unit_token;
};

static void conn_drive(struct conn *c);

static const char *
status_reason(int status)
{
	switch (status) {
	case 100: return "Continue";
	case 200: return "OK";
	case 201: return "Created";
	case 202: return "Accepted";
	case 400: return "Bad Request";
	case 401: return "Unauthorized";
	case 403: return "Forbidden";
	case 404: return "Not Found";
	case 405: return "Method Not Allowed";
	case 408: return "Request Timeout";
	case 409: return "Conflict";
	case 413: return "Payload Too Large";
	case 414: return "URI Too Long";
	case 422: return "Unprocessable Entity";
	case 429: return "Too Many Requests";
	case 431: return "Request Header Fields Too Large";
	case 500: return "Internal Server Error";
	case 501: return "Not Implemented";
	case 502: return "Bad Gateway";
	case 503: return "Service Unavailable";
	case 504: return "Gateway Timeout";
	default:  return "Stub Status";
	}
}

/* Free what a Responses / Messages / embeddings request owns. */
static void
req_free_api(struct req *r)
{
	free(r->model);
	free(r->instructions);
	free(r->prev_id);
	free(r->items);
	free(r->first_id);
	free(r->last_id);
	free(r->emb);
	buf_free(&r->context);
	r->model = r->instructions = r->prev_id = r->items = NULL;
	r->first_id = r->last_id = r->emb = NULL;
	r->model_len = r->instr_len = r->prev_len = r->items_len = r->emb_len = 0;
	r->prev_found = r->store = r->emb_base64 = 0;
	r->id_n = 0;
	r->id_off = r->id_len = 0;
	r->api = ROUTE_NOT_FOUND;
}

/* Forget the last request but keep (small) buffers for the next one. */
static void
req_reset(struct req *r)
{
	if (r->arena.cap > REQ_KEEP)
		buf_free(&r->arena);
	if (r->body.cap > REQ_KEEP)
		buf_free(&r->body);
	r->arena.len = 0;
	r->arena.err = 0;
	r->body.len = 0;
	r->body.err = 0;
	r->url_len = 0;
	r->nhdr = 0;
	r->last = LAST_NONE;
	r->err_status = 0;
	r->method = 0;
	r->started = r->complete = r->keep_alive = 0;
	r->expect_continue = r->continue_sent = 0;
	r->route = ROUTE_NOT_FOUND;
	r->stream = 0;
	r->include_usage = r->send_usage = r->stream_lax = 0;
	r->prompt_tokens = r->completion_tokens = 0;
	r->status = 0;
	r->errmsg[0] = '\0';
	r->extra_head[0] = '\0';
	r->dispatched = r->counted = 0;
	r->tag = NULL;
	r->slot = SLOT_NONE;
	free(r->blocks);
	r->blocks = NULL;
	r->nblocks = r->prompt_bytes = r->hit_blocks = 0;
	r->t_dispatch = r->t_slot = r->prefill_ms = 0;
	r->in_lane = 0;
	r->prefilling = 0;
	r->work_ms = r->t_lane_start = r->t_lane_end = 0;
	req_free_api(r);
}

static const char *
hdr_name(const struct req *r, const struct hdr *h)
{
	return r->arena.data + h->name_off;
}

static const char *
hdr_val(const struct req *r, const struct hdr *h)
{
	return r->arena.data + h->val_off;
}

/* The last header called name, value trimmed of blanks; NULL when absent. */
static const char *
req_header(const struct req *r, const char *name, size_t *len)
{
	size_t nlen = strlen(name);
	unsigned i;

	for (i = r->nhdr; i-- > 0; ) {
		const struct hdr *h = &r->hdrs[i];
		const char *v;
		size_t vl;

		if (h->name_len != nlen || strncasecmp(hdr_name(r, h), name, nlen) != 0)
			continue;
		v = hdr_val(r, h);
		vl = h->val_len;
		while (vl > 0 && (*v == ' ' || *v == '\t')) {
			v++;
			vl--;
		}
		while (vl > 0 && (v[vl - 1] == ' ' || v[vl - 1] == '\t'))
			vl--;
		*len = vl;
		return v;
	}
	return NULL;
}

/* Decimal, no sign, no junk; -1 on anything else. */
static int
parse_ll(const char *s, size_t n, long long *out)
{
	long long v = 0;
	size_t i;

	if (n == 0 || n > 18)
		return -1;
	for (i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -1;
		v = v * 10 + (s[i] - '0');
	}
	*out = v;
	return 0;
}

/* A header "A,B" of two decimal token counts into a, b (-1, -1 when absent). */
static int
parse_pair(struct req *r, const char *name, const char *want, long long *a,
    long long *b)
{
	const char *v, *comma;
	size_t len, pl;

	*a = *b = -1;
	if ((v = req_header(r, name, &len)) == NULL)
		return 0;
	comma = memchr(v, ',', len);
	pl = comma ? (size_t)(comma - v) : 0;
	if (comma == NULL || parse_ll(v, pl, a) < 0 ||
	    parse_ll(comma + 1, len - pl - 1, b) < 0) {
		*a = *b = -1;
		snprintf(r->errmsg, sizeof r->errmsg,
		    "bad %s: want %s (decimal token counts)", name, want);
		return -1;
	}
	return 0;
}

/* Fill r->k from the headers; -1 with r->errmsg set when a value is wrong. */
static int
req_parse_knobs(struct req *r)
{
	size_t i, len;
	const char *v;

	for (i = 0; i < NKNOBS; i++) {
		const struct knob_def *d = &knob_defs[i];
		long long *dst = (long long *)(void *)((char *)&r->k + d->off);
		long long x;

		v = req_header(r, d->name, &len);
		*dst = d->def;
		if (v == NULL)
			continue;
		if (parse_ll(v, len, &x) < 0 || x < d->min || x > d->max) {
			snprintf(r->errmsg, sizeof r->errmsg, "bad %s: want %lld..%lld",
			    d->name, d->min, d->max);
			return -1;
		}
		*dst = x;
	}
	if (r->k.status == 204 || r->k.status == 304) {
		snprintf(r->errmsg, sizeof r->errmsg, "bad X-Stub-Status: 204 and 304 carry no body");
		return -1;
	}
	if (parse_pair(r, "X-Stub-Usage", "P,C", &r->k.prompt_tokens,
	    &r->k.completion_tokens) < 0)
		return -1;
	if (parse_pair(r, "X-Stub-Cache-Tokens", "CC,CR", &r->k.cache_creation,
	    &r->k.cache_read) < 0)
		return -1;
	return 0;
}

/* ------------------------------------------------------------------ parser callbacks */

/* Callbacks only record; the state machine acts after http_parser_execute returns. */

static int
on_message_begin(http_parser *p)
{
	struct conn *c = p->data;

	c->req.started = 1;
	return 0;
}

static int
on_url(http_parser *p, const char *at, size_t len)
{
	struct req *r = &((struct conn *)p->data)->req;

	if (len > URL_CAP - r->url_len) {
		r->err_status = 414;
		return -1;
	}
	buf_append(&r->arena, at, len);
	if (r->arena.err) {
		r->err_status = 431;
		return -1;
	}
	r->url_len += len;
	return 0;
}

static int
on_header_field(http_parser *p, const char *at, size_t len)
{
	struct req *r = &((struct conn *)p->data)->req;
	struct hdr *h;

	if (r->last != LAST_FIELD) {
		if (r->nhdr == MAX_HEADERS) {
			r->err_status = 431;
			return -1;
		}
		h = &r->hdrs[r->nhdr++];
		h->name_off = h->val_off = (uint32_t)r->arena.len;
		h->name_len = h->val_len = 0;
	}
	h = &r->hdrs[r->nhdr - 1];
	buf_append(&r->arena, at, len);
	if (r->arena.err) {
		r->err_status = 431;
		return -1;
	}
	h->name_len += (uint32_t)len;
	h->val_off = (uint32_t)r->arena.len;
	r->last = LAST_FIELD;
	return 0;
}

static int
on_header_value(http_parser *p, const char *at, size_t len)
{
	struct req *r = &((struct conn *)p->data)->req;
	struct hdr *h;

	if (r->nhdr == 0)
		return -1;
	h = &r->hdrs[r->nhdr - 1];
	if (r->last != LAST_VALUE) {
		h->val_off = (uint32_t)r->arena.len;
		h->val_len = 0;
	}
	buf_append(&r->arena, at, len);
	if (r->arena.err) {
		r->err_status = 431;
		return -1;
	}
	h->val_len += (uint32_t)len;
	r->last = LAST_VALUE;
	return 0;
}

static int
on_headers_complete(http_parser *p)
{
	struct req *r = &((struct conn *)p->data)->req;
	const char *v;
	size_t len;
	int has_body;

	/* curl waits up to a second for "100 Continue" before sending a large body. */
	has_body = (p->flags & F_CHUNKED) ||
	    (p->content_length > 0 && p->content_length != ULLONG_MAX);
	v = req_header(r, "Expect", &len);
	if (has_body && v != NULL && len == 12 && strncasecmp(v, "100-continue", 12) == 0)
		r->expect_continue = 1;
	return 0;
}

static int
on_body(http_parser *p, const char *at, size_t len)
{
	struct req *r = &((struct conn *)p->data)->req;

	buf_append(&r->body, at, len);
	if (r->body.err) {
		r->err_status = 413;
		return -1;
	}
	return 0;
}

static int
on_message_complete(http_parser *p)
{
	struct conn *c = p->data;

	c->req.complete = 1;
	c->req.method = p->method;
	c->req.keep_alive = http_should_keep_alive(p) && p->method != HTTP_HEAD;
	/* One request at a time: the rest of the input waits in c->in. */
	http_parser_pause(p, 1);
	return 0;
}

static const http_parser_settings parser_settings = {
	.on_message_begin = on_message_begin,
	.on_url = on_url,
	.on_header_field = on_header_field,
	.on_header_value = on_header_value,
	.on_headers_complete = on_headers_complete,
	.on_body = on_body,
	.on_message_complete = on_message_complete,
};

/* ------------------------------------------------------------------ accounting */

static void
conn_set_state(struct conn *c, enum conn_state s)
{
	c->state = s;
}

static void
conn_set_closing(struct conn *c, enum outcome o)
{
	c->close_outcome = o;
	conn_set_state(c, CONN_CLOSING);
}

/* Take one unit of inflight for a /v1/ request (global and per tag). */
static void
req_count(struct conn *c)
{
	struct stats *st = &c->ctx->st;
	struct tag *t = c->req.tag;

	c->req.counted = 1;
	st->requests++;
	st->inflight++;
	if (t != NULL) {
		t->requests++;
		t->inflight++;
	}
	c->ctx->peak_dirty = 1;
}

/*
 * max_inflight is taken after all the events of a loop iteration are
 * handled, not at each new request: libev invokes one iteration's callbacks
 * last-ready first, so a request that arrived after its predecessor's
 * connection was closed (a client killed, a slot handed on) could be counted
 * before that close, and show a concurrency that never existed.
 */
static void
peak_update(struct stub *ctx)
{
	struct tag *t;

	if (!ctx->peak_dirty)
		return;
	ctx->peak_dirty = 0;
	if (ctx->st.inflight > ctx->st.max_inflight)
		ctx->st.max_inflight = ctx->st.inflight;
	TAILQ_FOREACH(t, &ctx->tags, entry)
		if (t->inflight > t->max_inflight)
			t->max_inflight = t->inflight;
}

static void
peak_cb(struct ev_loop *loop, ev_prepare *w, int revents)
{
	peak_update(w->data);
}

static void runner_release(struct conn *c);

/*
 * Call exactly once per dispatched request, when its response is done or its
 * connection goes: releases inflight and its batch slot, and logs one line.
 */
static void
req_finish(struct conn *c, enum outcome o)
{
	static const char *const names[] = { "done", "aborted_by_client", "cut", "shutdown" };
	struct stats *st = &c->ctx->st;
	struct req *r = &c->req;
	struct tag *t = r->tag;

	if (!r->dispatched)
		return;
	r->dispatched = 0;
	runner_release(c);
	stub_log(c->ctx, "%s %.*s tag=%s status=%d events=%lld %s",
	    http_method_str((enum http_method)r->method), (int)r->url_len,
	    r->arena.data ? r->arena.data : "", t ? t->name : "-", r->status,
	    c->events_sent, names[o]);
	if (!r->counted)
		return;
	r->counted = 0;
	st->inflight--;
	if (o == OUT_ABORTED_BY_CLIENT)
		st->aborted_by_client++;
	if (t != NULL) {
		t->inflight--;
		if (o == OUT_COMPLETED)
			t->completed++;
		else if (o == OUT_ABORTED_BY_CLIENT)
			t->aborted_by_client++;
	}
}

/* ------------------------------------------------------------------ stored responses */

static size_t
rs_hash(const char *id, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ULL;
	size_t i;

	for (i = 0; i < n; i++)
		h = (h ^ (unsigned char)id[i]) * 0x100000001b3ULL;
	return (size_t)(h % RS_BUCKETS);
}

/* The stored response called id (refreshed as the most recent), or NULL. */
static struct rs_ent *
rs_find(struct stub *ctx, const char *id, size_t n)
{
	struct rs_ent *e;

	for (e = ctx->rs_bucket[rs_hash(id, n)]; e != NULL; e = e->hnext)
		if (e->idlen == n && memcmp(e->id, id, n) == 0) {
			TAILQ_REMOVE(&ctx->rs_lru, e, lru);
			TAILQ_INSERT_HEAD(&ctx->rs_lru, e, lru);
			return e;
		}
	return NULL;
}

static void
rs_drop(struct stub *ctx, struct rs_ent *e)
{
	struct rs_ent **p;

	for (p = &ctx->rs_bucket[rs_hash(e->id, e->idlen)]; *p != e; p = &(*p)->hnext)
		;
	*p = e->hnext;
	TAILQ_REMOVE(&ctx->rs_lru, e, lru);
	ctx->rs_n--;
	ctx->rs_bytes -= e->bytes;
	free(e->id);
	free(e->obj);
	free(e->items);
	free(e->first_id);
	free(e->last_id);
	free(e->context);
	free(e);
}

static void
rs_clear(struct stub *ctx)
{
	struct rs_ent *e;

	while ((e = TAILQ_FIRST(&ctx->rs_lru)) != NULL)
		rs_drop(ctx, e);
}

static char *
memdup(const char *p, size_t n)
{
	char *d = malloc(n + 1);

	if (d != NULL) {
		if (n > 0)
			memcpy(d, p, n);
		d[n] = '\0';
	}
	return d;
}

/*
 * Keep a response: its object (obj), input items and conversation text. The
 * least recent ones go while more than RS_MAX or RS_MAX_BYTES are held.
 */
static void
rs_store(struct stub *ctx, const char *id, size_t idlen, const char *obj, size_t objlen,
    const struct req *r, const char *ctxt, size_t ctxlen)
{
	struct rs_ent *e;
	size_t h;

	if ((e = calloc(1, sizeof *e)) == NULL)
		return;
	e->id = memdup(id, idlen);
	e->obj = memdup(obj, objlen);
	e->items = memdup(r->items ? r->items : "[]", r->items ? r->items_len : 2);
	e->first_id = strdup(r->first_id ? r->first_id : "null");
	e->last_id = strdup(r->last_id ? r->last_id : "null");
	e->context = memdup(ctxt, ctxlen);
	if (e->id == NULL || e->obj == NULL || e->items == NULL || e->first_id == NULL ||
	    e->last_id == NULL || e->context == NULL) {
		free(e->id);
		free(e->obj);
		free(e->items);
		free(e->first_id);
		free(e->last_id);
		free(e->context);
		free(e);
		stub_log(ctx, "out of memory storing a response; it is not stored");
		return;
	}
	e->idlen = idlen;
	e->objlen = objlen;
	e->itemslen = r->items ? r->items_len : 2;
	e->ctxlen = ctxlen;
	e->bytes = sizeof *e + idlen + objlen + e->itemslen + ctxlen;
	h = rs_hash(id, idlen);
	e->hnext = ctx->rs_bucket[h];
	ctx->rs_bucket[h] = e;
	TAILQ_INSERT_HEAD(&ctx->rs_lru, e, lru);
	ctx->rs_n++;
	ctx->rs_bytes += e->bytes;
	ctx->st.responses_stored++;
	while (ctx->rs_n > 1 && (ctx->rs_n > RS_MAX || ctx->rs_bytes > RS_MAX_BYTES)) {
		rs_drop(ctx, TAILQ_LAST(&ctx->rs_lru, rs_list));
		ctx->st.responses_evicted++;
	}
}

/* Zero the counters. Gauges stay; tags still referenced by a request stay. */
static void
stats_reset(struct stub *ctx)
{
	struct stats *st = &ctx->st;
	struct tag *t, *tnext;

	st->requests = st->streams_started = st->streams_completed = 0;
	st->aborted_by_client = st->blocked_writes = st->bytes_sent = 0;
	st->connections_total = 0;
	st->health_requests = st->busy_rejected = st->loading_rejected = 0;
	st->include_usage_requests = st->usage_chunks = 0;
	st->responses_stored = st->responses_evicted = st->responses_deleted = 0;
	st->previous_found = st->previous_missing = 0;
	st->retrieve_found = st->retrieve_missing = 0;
	rs_clear(ctx);
	st->max_inflight = st->inflight;
	ctx->last_body.len = 0;
	ctx->last_path[0] = '\0';
	pc_clear(&ctx->pc);
	memset(&ctx->rs, 0, sizeof ctx->rs);
	ctx->rs.max_running = ctx->running;
	ctx->rs.max_waiting = ctx->waiting;
	memset(&ctx->last_prefill, 0, sizeof ctx->last_prefill);
	ctx->ring_n = ctx->ring_next = 0;
	for (t = TAILQ_FIRST(&ctx->tags); t != NULL; t = tnext) {
		tnext = TAILQ_NEXT(t, entry);
		if (t->inflight == 0) {
			TAILQ_REMOVE(&ctx->tags, t, entry);
			ctx->ntags--;
			free(t);
			continue;
		}
		t->requests = t->completed = t->aborted_by_client = t->bytes_sent = 0;
		t->include_usage_requests = 0;
		t->max_inflight = t->inflight;
	}
}

/* ------------------------------------------------------------------ replica modes */

#define SECS_MAX 86400LL	/* cap of --slow-start and --busy-retry-after */

static double
mono_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Inside the --slow-start (or POST /stub/slow-start) window. */
static int
stub_loading(const struct stub *ctx)
{
	return ctx->loading_until > 0 && mono_now() < ctx->loading_until;
}

/* 200..599, not 204/304: the answer carries a JSON body. */
static int
health_status_ok(long long v)
{
	return v >= 200 && v <= 599 && v != 204 && v != 304;
}

/* "S" or "S.F", 0..SECS_MAX seconds; -1 on anything else. */
static int
parse_secs(const char *s, size_t n, double *out)
{
	const char *dot = memchr(s, '.', n);
	size_t il = dot ? (size_t)(dot - s) : n, i;
	long long ip;
	double frac = 0, scale = 0.1;

	if (parse_ll(s, il, &ip) < 0 || ip > SECS_MAX)
		return -1;
	if (dot != NULL) {
		if (n - il - 1 == 0 || n - il - 1 > 9)
			return -1;
		for (i = il + 1; i < n; i++, scale /= 10) {
			if (s[i] < '0' || s[i] > '9')
				return -1;
			frac += (s[i] - '0') * scale;
		}
	}
	if (ip == SECS_MAX && frac > 0)
		return -1;
	*out = (double)ip + frac;
	return 0;
}

/* Start (secs > 0) or end (0) the loading window, counted from now. */
static void
stub_set_loading(struct stub *ctx, double secs)
{
	ctx->loading_until = secs > 0 ? mono_now() + secs : 0;
}

/* The modes, as fields of an object already opened (leading comma). */
static void
buf_mode(struct buf *b, const struct stub *ctx)
{
	double left = ctx->loading_until - mono_now();

	if (ctx->loading_until <= 0 || left < 0)
		left = 0;
	buf_printf(b, ",\"health_status\":%d,\"busy\":%d,\"busy_status\":%d"
	    ",\"busy_retry_after\":%lld,\"loading\":%d,\"loading_left_ms\":%lld",
	    ctx->health_status, ctx->busy, ctx->busy_status, ctx->busy_retry_after,
	    left > 0, (long long)(left * 1000.0 + 0.999));
}

/* ------------------------------------------------------------------ response builders */

/* Start a JSON body; resp_json_end() puts the head in front of it. */
static void
resp_json_begin(struct conn *c)
{
	c->out.len = 0;
	c->out.err = 0;
	buf_fill(&c->out, ' ', HEAD_ROOM);
}

/* Put the head (status, ctype, Content-Length) in front of the body begun above. */
static void
resp_body_end(struct conn *c, int status, const char *ctype)
{
	char head[HEAD_ROOM];
	size_t body_len;
	int hl;

	c->req.status = status;
	c->kind = RESP_FIXED;
	if (c->out.err)
		return;
	body_len = c->out.len - HEAD_ROOM;
	hl = snprintf(head, sizeof head,
	    "HTTP/1.1 %d %s\r\nContent-Type: %s\r\n"
	    "Content-Length: %zu\r\n%s%s\r\n",
	    status, status_reason(status), ctype, body_len, c->req.extra_head,
	    c->req.keep_alive ? "" : "Connection: close\r\n");
	memcpy(c->out.data + HEAD_ROOM - hl, head, (size_t)hl);
	c->out_pos = HEAD_ROOM - (size_t)hl;
}

static void
resp_json_end(struct conn *c, int status)
{
	resp_body_end(c, status, "application/json");
}

static void
resp_error(struct conn *c, int status, const char *msg)
{
	resp_json_begin(c);
	buf_puts(&c->out, "{\"error\":{\"message\":");
	buf_json_str(&c->out, msg, strlen(msg));
	buf_printf(&c->out, ",\"type\":\"stub\",\"code\":%d}}", status);
	resp_json_end(c, status);
}

/* The "usage" member (no comma before it), with the request's token counts. */
static void
buf_usage(struct buf *b, const struct req *r)
{
	buf_printf(b, "\"usage\":{\"prompt_tokens\":%lld,\"completion_tokens\":%lld"
	    ",\"total_tokens\":%lld}", r->prompt_tokens, r->completion_tokens,
	    r->prompt_tokens + r->completion_tokens);
}

static void
resp_completion(struct conn *c)
{
	long long i;

	resp_json_begin(c);
	buf_puts(&c->out, "{\"id\":\"chatcmpl-stub\",\"object\":\"chat.completion\","
	    "\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"");
	for (i = 0; i < c->req.k.events; i++)
		buf_printf(&c->out, "tok%lld ", i);
	if (c->req.k.ignore_usage) {
		/* A runner that reports no usage at all. */
		buf_puts(&c->out, "\"},\"finish_reason\":\"stop\"}]}");
	} else {
		buf_puts(&c->out, "\"},\"finish_reason\":\"stop\"}],");
		buf_usage(&c->out, &c->req);
		buf_puts(&c->out, "}");
	}
	resp_json_end(c, 200);
	if (c->req.k.abort_after >= 0 && !c->out.err) {
		/* The head promises the whole body; the cut shows as a short read. */
		char *end = memmem(c->out.data + c->out_pos, c->out.len - c->out_pos,
		    "\r\n\r\n", 4);
		c->out.len = (size_t)(end + 4 - c->out.data);
		c->kind = RESP_CUT_AFTER_HEAD;
	}
}

static void
resp_echo(struct conn *c)
{
	struct req *r = &c->req;
	const char *url = r->arena.data ? r->arena.data : "";
	const char *q = memchr(url, '?', r->url_len);
	size_t plen = q ? (size_t)(q - url) : r->url_len;
	const char *method = http_method_str((enum http_method)r->method);
	unsigned i;

	resp_json_begin(c);
	buf_puts(&c->out, "{\"method\":");
	buf_json_str(&c->out, method, strlen(method));
	buf_puts(&c->out, ",\"path\":");
	buf_json_str(&c->out, url, plen);
	buf_puts(&c->out, ",\"query\":");
	if (q != NULL)
		buf_json_str(&c->out, q + 1, r->url_len - plen - 1);
	else
		buf_puts(&c->out, "\"\"");
	buf_puts(&c->out, ",\"headers\":[");
	for (i = 0; i < r->nhdr; i++) {
		const struct hdr *h = &r->hdrs[i];

		buf_puts(&c->out, i ? ",[" : "[");
		buf_json_str(&c->out, hdr_name(r, h), h->name_len);
		buf_puts(&c->out, ",");
		buf_json_str(&c->out, hdr_val(r, h), h->val_len);
		buf_puts(&c->out, "]");
	}
	buf_puts(&c->out, "],\"body\":");
	buf_json_str(&c->out, r->body.data ? r->body.data : "", r->body.len);
	buf_puts(&c->out, "}");
	resp_json_end(c, 200);
}

static void
resp_models(struct conn *c)
{
	resp_json_begin(c);
	buf_puts(&c->out, "{\"object\":\"list\",\"data\":[{\"id\":\"stub\",\"object\":\"model\","
	    "\"created\":0,\"owned_by\":\"sluice-stub\"}]}");
	resp_json_end(c, 200);
}

/* llama.cpp server's answer while it loads a model, on /health and everything else. */
static void
resp_loading(struct conn *c)
{
	resp_json_begin(c);
	buf_puts(&c->out, "{\"error\":{\"code\":503,\"message\":\"Loading model\","
	    "\"type\":\"unavailable_error\"}}");
	resp_json_end(c, 503);
}

static void
resp_health(struct conn *c)
{
	const struct stub *ctx = c->ctx;
	char msg[64];

	if (stub_loading(ctx) || ctx->health_status == 503)
		resp_loading(c);
	else if (ctx->health_status < 300) {
		resp_json_begin(c);
		buf_puts(&c->out, "{\"status\":\"ok\"}");
		resp_json_end(c, ctx->health_status);
	} else {
		snprintf(msg, sizeof msg, "stub health %d", ctx->health_status);
		resp_error(c, ctx->health_status, msg);
	}
}

static void resp_stub_error(struct conn *c, int status, const char *msg);

static void
resp_busy(struct conn *c)
{
	const struct stub *ctx = c->ctx;

	snprintf(c->req.extra_head, sizeof c->req.extra_head, "Retry-After: %lld\r\n",
	    ctx->busy_retry_after);
	resp_stub_error(c, ctx->busy_status, "stub busy");
}

/*
 * The next "key=value" of a query string: key and value point into q. Returns 0
 * when there are no more, advancing *pos past the '&'.
 */
static int
query_next(const char *q, size_t qlen, size_t *pos, const char **key, size_t *klen,
    const char **val, size_t *vlen)
{
	const char *p, *amp, *eq;
	size_t n;

	while (*pos < qlen && q[*pos] == '&')
		(*pos)++;
	if (*pos >= qlen)
		return 0;
	p = q + *pos;
	amp = memchr(p, '&', qlen - *pos);
	n = amp ? (size_t)(amp - p) : qlen - *pos;
	*pos += n;
	eq = memchr(p, '=', n);
	*key = p;
	*klen = eq ? (size_t)(eq - p) : n;
	*val = eq ? eq + 1 : p + n;
	*vlen = eq ? n - *klen - 1 : 0;
	return 1;
}

#define KEY_IS(s) (klen == sizeof(s) - 1 && memcmp(key, s, klen) == 0)

/*
 * POST /stub/health, /stub/busy, /stub/slow-start: parse the whole query, then
 * apply it (all or nothing). -1 with errmsg set on an unknown, missing or bad
 * parameter.
 */
static int
ctl_apply(struct conn *c)
{
	struct req *r = &c->req;
	struct stub *ctx = c->ctx;
	const char *url = r->arena.data ? r->arena.data : "";
	const char *q = memchr(url, '?', r->url_len), *key, *val;
	size_t qlen = q ? r->url_len - (size_t)(q + 1 - url) : 0, pos = 0, klen, vlen;
	long long status = -1, on = -1, retry_after = -1, v;
	double secs = -1;

	if (q != NULL)
		q++;
	while (q != NULL && query_next(q, qlen, &pos, &key, &klen, &val, &vlen)) {
		if (r->route == ROUTE_CTL_HEALTH && KEY_IS("status")) {
			if (parse_ll(val, vlen, &v) < 0 || !health_status_ok(v)) {
				snprintf(r->errmsg, sizeof r->errmsg,
				    "bad status: want 200..599, not 204/304");
				return -1;
			}
			status = v;
		} else if (r->route == ROUTE_CTL_BUSY && KEY_IS("on")) {
			if (parse_ll(val, vlen, &v) < 0 || v > 1) {
				snprintf(r->errmsg, sizeof r->errmsg, "bad on: want 0 or 1");
				return -1;
			}
			on = v;
		} else if (r->route == ROUTE_CTL_BUSY && KEY_IS("status")) {
			if (parse_ll(val, vlen, &v) < 0 || (v != 429 && v != 503)) {
				snprintf(r->errmsg, sizeof r->errmsg, "bad status: want 429 or 503");
				return -1;
			}
			status = v;
		} else if (r->route == ROUTE_CTL_BUSY && KEY_IS("retry_after")) {
			if (parse_ll(val, vlen, &v) < 0 || v > SECS_MAX) {
				snprintf(r->errmsg, sizeof r->errmsg,
				    "bad retry_after: want 0..%lld", SECS_MAX);
				return -1;
			}
			retry_after = v;
		} else if (r->route == ROUTE_CTL_SLOW_START && KEY_IS("seconds")) {
			if (parse_secs(val, vlen, &secs) < 0) {
				snprintf(r->errmsg, sizeof r->errmsg,
				    "bad seconds: want 0..%lld (fraction allowed)", SECS_MAX);
				return -1;
			}
		} else {
			snprintf(r->errmsg, sizeof r->errmsg, "unknown parameter '%.*s'",
			    klen > 32 ? 32 : (int)klen, key);
			return -1;
		}
	}
	switch (r->route) {
	case ROUTE_CTL_HEALTH:
		if (status < 0) {
			snprintf(r->errmsg, sizeof r->errmsg, "want ?status=CODE");
			return -1;
		}
		ctx->health_status = (int)status;
		break;
	case ROUTE_CTL_BUSY:
		if (on < 0) {
			snprintf(r->errmsg, sizeof r->errmsg, "want ?on=0 or ?on=1");
			return -1;
		}
		ctx->busy = (int)on;
		if (status >= 0)
			ctx->busy_status = (int)status;
		if (retry_after >= 0)
			ctx->busy_retry_after = retry_after;
		break;
	case ROUTE_CTL_SLOW_START:
		if (secs < 0) {
			snprintf(r->errmsg, sizeof r->errmsg, "want ?seconds=S");
			return -1;
		}
		stub_set_loading(ctx, secs);
		break;
	default:
		break;
	}
	return 0;
}

#undef KEY_IS

/* The answer to a control request that took effect: the modes now. */
static void
resp_mode(struct conn *c)
{
	resp_json_begin(c);
	buf_puts(&c->out, "{\"ok\":true");
	buf_mode(&c->out, c->ctx);
	buf_puts(&c->out, "}");
	resp_json_end(c, 200);
}

/* GET /stub/last: the last completion body, byte for byte; 404 when none since reset. */
static void
resp_last(struct conn *c)
{
	const struct stub *ctx = c->ctx;

	if (ctx->last_path[0] == '\0') {
		resp_error(c, 404, "no completion request since start or reset");
		return;
	}
	snprintf(c->req.extra_head, sizeof c->req.extra_head, "X-Stub-Path: %s\r\n",
	    ctx->last_path);
	resp_json_begin(c);
	buf_append(&c->out, ctx->last_body.data, ctx->last_body.len);
	resp_json_end(c, 200);
}

/* The runner model's settings, gauges and counters, as fields (leading comma). */
static void
buf_runner(struct buf *b, const struct stub *ctx)
{
	const struct runner_stats *rs = &ctx->rs;
	const struct last_prefill *lp = &ctx->last_prefill;

	buf_printf(b, ",\"runner\":{\"batch\":%lld,\"prefix_cache\":%" PRIu32
	    ",\"block\":%zu", ctx->batch, ctx->pc.cap, ctx->block);
	buf_printf(b, ",\"ttft_base_ms\":%.3f,\"ttft_ms_per_kib\":%.3f"
	    ",\"prefill_mode\":\"%s\"}", ctx->ttft_base_ms, ctx->ttft_ms_per_kib,
	    ctx->prefill_shared ? "shared" : "independent");
	buf_printf(b, ",\"running\":%" PRIu64 ",\"waiting\":%" PRIu64
	    ",\"max_running\":%" PRIu64 ",\"max_waiting\":%" PRIu64,
	    ctx->running, ctx->waiting, rs->max_running, rs->max_waiting);
	buf_printf(b, ",\"prefilling\":%" PRIu64 ",\"lane_backlog_ms\":%.3f",
	    ctx->prefilling, ctx->prefill_shared && ctx->lane_free > mono_now() ?
	    (ctx->lane_free - mono_now()) * 1000.0 : 0.0);
	buf_printf(b, ",\"prefills\":%" PRIu64 ",\"prompt_bytes\":%" PRIu64
	    ",\"prompt_bytes_hit\":%" PRIu64, rs->prefills, rs->prompt_bytes,
	    rs->prompt_bytes_hit);
	buf_printf(b, ",\"prompt_blocks\":%" PRIu64 ",\"prefix_hit_blocks\":%" PRIu64
	    ",\"prefix_hit_requests\":%" PRIu64, rs->prompt_blocks, rs->hit_blocks,
	    rs->hit_requests);
	buf_printf(b, ",\"cache_blocks\":%" PRIu32 ",\"cache_evictions\":%" PRIu64,
	    ctx->pc.used, ctx->pc.evictions);
	buf_printf(b, ",\"queue_ms_total\":%.3f,\"prefill_ms_total\":%.3f"
	    ",\"lane_ms_total\":%.3f", rs->queue_ms_total, rs->prefill_ms_total,
	    rs->lane_ms_total);
	if (!lp->valid) {
		buf_puts(b, ",\"last_prefill\":null");
		return;
	}
	buf_printf(b, ",\"last_prefill\":{\"prompt_bytes\":%" PRIu64 ",\"blocks\":%" PRIu64
	    ",\"hit_blocks\":%" PRIu64 ",\"hit_bytes\":%" PRIu64, lp->prompt_bytes,
	    lp->blocks, lp->hit_blocks, lp->hit_bytes);
	buf_printf(b, ",\"queue_ms\":%.3f,\"lane_ms\":%.3f,\"prefill_ms\":%.3f",
	    lp->queue_ms, lp->lane_ms, lp->prefill_ms);
	buf_printf(b, ",\"ttft_ms\":%.3f,\"slot_ms\":%.3f}", lp->ttft_ms, lp->slot_ms);
}

/* GET /stub/prefills: the ring of the last prefills, oldest first. */
static void
resp_prefills(struct conn *c)
{
	const struct stub *ctx = c->ctx;
	const struct prefill_rec *p;
	struct buf *b = &c->out;
	size_t i, k;

	resp_json_begin(c);
	buf_puts(b, "{\"prefills\":[");
	for (i = 0; i < ctx->ring_n; i++) {
		k = (ctx->ring_next + PREFILL_RING - ctx->ring_n + i) % PREFILL_RING;
		p = &ctx->ring[k];
		buf_printf(b, "%s{\"prompt_bytes\":%" PRIu64 ",\"hit_bytes\":%" PRIu64,
		    i ? "," : "", p->prompt_bytes, p->hit_bytes);
		buf_printf(b, ",\"queue_ms\":%.3f,\"lane_ms\":%.3f,\"prefill_ms\":%.3f"
		    ",\"ttft_ms\":%.3f,\"slot_ms\":%.3f}", p->queue_ms, p->lane_ms,
		    p->prefill_ms, p->ttft_ms, p->slot_ms);
	}
	buf_puts(b, "]}");
	resp_json_end(c, 200);
}

/*
 * GET /metrics: the gauges a router scrapes from vLLM, in its names and
 * Prometheus text format. kv_cache_usage_perc is, as in vLLM, the blocks the
 * running requests hold over the cache's size (cached blocks nobody uses are
 * free to evict: not in use), at most 1; 0 without a prefix cache.
 */
static void
resp_metrics(struct conn *c)
{
	const struct stub *ctx = c->ctx;
	struct buf *b = &c->out;
	double kv = ctx->pc.cap ? (double)ctx->running_blocks / (double)ctx->pc.cap :
	    0.0;

	if (kv > 1.0)
		kv = 1.0;

	resp_json_begin(c);
	buf_puts(b, "# HELP vllm:num_requests_running Number of requests in model execution "
	    "batches.\n# TYPE vllm:num_requests_running gauge\n");
	buf_printf(b, "vllm:num_requests_running{model_name=\"stub\"} %" PRIu64 ".0\n",
	    ctx->running);
	buf_puts(b, "# HELP vllm:num_requests_waiting Number of requests waiting to be "
	    "processed.\n# TYPE vllm:num_requests_waiting gauge\n");
	buf_printf(b, "vllm:num_requests_waiting{model_name=\"stub\"} %" PRIu64 ".0\n",
	    ctx->waiting);
	buf_puts(b, "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent "
	    "usage.\n# TYPE vllm:kv_cache_usage_perc gauge\n");
	buf_printf(b, "vllm:kv_cache_usage_perc{model_name=\"stub\"} %.6f\n", kv);
	resp_body_end(c, 200, "text/plain; version=0.0.4; charset=utf-8");
}

static void
resp_stats(struct conn *c)
{
	const struct stats *st = &c->ctx->st;
	const struct tag *t;
	struct buf *b = &c->out;

	resp_json_begin(c);
	buf_printf(b, "{\"requests\":%" PRIu64 ",\"streams_started\":%" PRIu64
	    ",\"streams_completed\":%" PRIu64 ",\"aborted_by_client\":%" PRIu64,
	    st->requests, st->streams_started, st->streams_completed, st->aborted_by_client);
	buf_printf(b, ",\"inflight\":%" PRIu64 ",\"max_inflight\":%" PRIu64
	    ",\"blocked_writes\":%" PRIu64 ",\"bytes_sent\":%" PRIu64,
	    st->inflight, st->max_inflight, st->blocked_writes, st->bytes_sent);
	buf_printf(b, ",\"connections_open\":%" PRIu64 ",\"connections_total\":%" PRIu64,
	    st->connections_open, st->connections_total);
	buf_printf(b, ",\"health_requests\":%" PRIu64 ",\"busy_rejected\":%" PRIu64
	    ",\"loading_rejected\":%" PRIu64,
	    st->health_requests, st->busy_rejected, st->loading_rejected);
	buf_printf(b, ",\"include_usage_requests\":%" PRIu64 ",\"usage_chunks\":%" PRIu64,
	    st->include_usage_requests, st->usage_chunks);
	buf_printf(b, ",\"responses_stored\":%" PRIu64 ",\"responses_held\":%zu"
	    ",\"responses_evicted\":%" PRIu64 ",\"responses_deleted\":%" PRIu64,
	    st->responses_stored, c->ctx->rs_n, st->responses_evicted,
	    st->responses_deleted);
	buf_printf(b, ",\"previous_found\":%" PRIu64 ",\"previous_missing\":%" PRIu64
	    ",\"retrieve_found\":%" PRIu64 ",\"retrieve_missing\":%" PRIu64,
	    st->previous_found, st->previous_missing, st->retrieve_found,
	    st->retrieve_missing);
	buf_runner(b, c->ctx);
	buf_mode(b, c->ctx);
	buf_puts(b, ",\"tags\":{");
	TAILQ_FOREACH(t, &c->ctx->tags, entry) {
		if (t != TAILQ_FIRST(&c->ctx->tags))
			buf_puts(b, ",");
		buf_json_str(b, t->name, strlen(t->name));
		buf_printf(b, ":{\"requests\":%" PRIu64 ",\"inflight\":%" PRIu64
		    ",\"max_inflight\":%" PRIu64, t->requests, t->inflight, t->max_inflight);
		buf_printf(b, ",\"completed\":%" PRIu64 ",\"aborted_by_client\":%" PRIu64
		    ",\"bytes_sent\":%" PRIu64 ",\"include_usage_requests\":%" PRIu64 "}",
		    t->completed, t->aborted_by_client, t->bytes_sent, t->include_usage_requests);
	}
	buf_puts(b, "}}");
	resp_json_end(c, 200);
}

/* ------------------------------------------------------------------ Responses, Messages, embeddings */

static void resp_chunk_frame(struct conn *c);

/* The served model's name: the request's "model" string, else "stub". */
static void
buf_model(struct buf *b, const struct req *r)
{
	if (r->model != NULL)
		buf_json_str(b, r->model, r->model_len);
	else
		buf_puts(b, "\"stub\"");
}

/* The answer's text, unquoted: "tok0 tok1 ... " (nothing to escape). */
static void
buf_tokens(struct buf *b, long long n)
{
	long long i;

	for (i = 0; i < n; i++)
		buf_printf(b, "tok%lld ", i);
}

/* resp_PORT_PID_N, msg_PORT_PID_N: unique across the stubs of a test. */
static void
api_id(const struct conn *c, const char *prefix, char *out, size_t outsz)
{
	static long pid;   /* the stub never forks: read once, not a syscall a unit */

	if (pid == 0)
		pid = (long)getpid();
	snprintf(out, outsz, "%s_%u_%ld_%llu", prefix, c->ctx->port, pid, c->req.id_n);
}

/* ,"t":NANOS for X-Stub-Stamp: 1, else nothing. */
static void
buf_stamp(struct buf *b, const struct req *r)
{
	struct timespec ts;

	if (!r->k.stamp)
		return;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	buf_printf(b, ",\"t\":%lld", (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
}

/* The output_text part: {"type":"output_text","annotations":[],"logprobs":[],"text":T}. */
static void
buf_output_text(struct buf *b, const struct req *r, int full)
{
	buf_puts(b, "{\"type\":\"output_text\",\"annotations\":[],\"logprobs\":[],\"text\":\"");
	if (full)
		buf_tokens(b, r->k.events);
	buf_puts(b, "\"}");
}

/* The message output item, in progress (no content yet) or completed. */
static void
buf_output_item(struct buf *b, const struct conn *c, int done)
{
	char mid[96];

	api_id(c, "msg", mid, sizeof mid);
	buf_printf(b, "{\"id\":\"%s\",\"type\":\"message\",\"status\":\"%s\",\"content\":[",
	    mid, done ? "completed" : "in_progress");
	if (done)
		buf_output_text(b, &c->req, 1);
	buf_puts(b, "],\"role\":\"assistant\"}");
}

/* A Responses API response object, in progress (no output, no usage) or completed. */
static void
buf_response(struct buf *b, const struct conn *c, int done)
{
	const struct req *r = &c->req;
	char rid[96];

	api_id(c, "resp", rid, sizeof rid);
	buf_printf(b, "{\"id\":\"%s\",\"object\":\"response\",\"created_at\":0,"
	    "\"status\":\"%s\",", rid, done ? "completed" : "in_progress");
	buf_puts(b, "\"background\":false,\"error\":null,\"incomplete_details\":null,"
	    "\"instructions\":");
	if (r->instructions != NULL)
		buf_json_str(b, r->instructions, r->instr_len);
	else
		buf_puts(b, "null");
	buf_puts(b, ",\"max_output_tokens\":null,\"model\":");
	buf_model(b, r);
	buf_puts(b, ",\"output\":[");
	if (done)
		buf_output_item(b, c, 1);
	buf_puts(b, "],\"parallel_tool_calls\":true,\"previous_response_id\":");
	if (r->prev_id != NULL)
		buf_json_str(b, r->prev_id, r->prev_len);
	else
		buf_puts(b, "null");
	buf_printf(b, ",\"reasoning\":null,\"store\":%s,\"temperature\":1.0,"
	    "\"text\":{\"format\":{\"type\":\"text\"}},\"tool_choice\":\"auto\",\"tools\":[],"
	    "\"top_p\":1.0,\"truncation\":\"disabled\",\"usage\":", r->store ? "true" : "false");
	if (done && !r->k.ignore_usage)
		buf_printf(b, "{\"input_tokens\":%lld,\"input_tokens_details\":"
		    "{\"cached_tokens\":0},\"output_tokens\":%lld,\"output_tokens_details\":"
		    "{\"reasoning_tokens\":0},\"total_tokens\":%lld}", r->prompt_tokens,
		    r->completion_tokens, r->prompt_tokens + r->completion_tokens);
	else
		buf_puts(b, "null");
	buf_puts(b, ",\"user\":null,\"metadata\":{}}");
}

/*
 * Store the completed response (unless the body said "store": false), with
 * its conversation text: its prompt's, then its output.
 */
static void
resp_keep(struct conn *c)
{
	struct req *r = &c->req;
	struct buf obj;
	char rid[96];

	if (!r->store)
		return;
	buf_init(&obj, OUT_CAP);
	buf_response(&obj, c, 1);
	buf_tokens(&r->context, r->k.events);
	api_id(c, "resp", rid, sizeof rid);
	if (!obj.err)
		rs_store(c->ctx, rid, strlen(rid), obj.data, obj.len, r,
		    r->context.data ? r->context.data : "", r->context.len);
	buf_free(&obj);
}

/* The head promises the whole body; the cut (X-Stub-Abort-After) shows as a short read. */
static void
resp_cut_after_head(struct conn *c)
{
	char *end;

	if (c->req.k.abort_after < 0 || c->out.err)
		return;
	end = memmem(c->out.data + c->out_pos, c->out.len - c->out_pos, "\r\n\r\n", 4);
	c->out.len = (size_t)(end + 4 - c->out.data);
	c->kind = RESP_CUT_AFTER_HEAD;
}

/* POST /v1/responses without "stream": the completed response object. */
static void
resp_responses_json(struct conn *c)
{
	resp_json_begin(c);
	buf_response(&c->out, c, 1);
	resp_json_end(c, 200);
	resp_keep(c);
	resp_cut_after_head(c);
}

/* Anthropic's usage object (no comma before it); output_tokens as given. */
static void
buf_anthropic_usage(struct buf *b, const struct req *r, long long output_tokens)
{
	buf_printf(b, "\"usage\":{\"input_tokens\":%lld", r->prompt_tokens);
	if (r->k.cache_creation >= 0)
		buf_printf(b, ",\"cache_creation_input_tokens\":%lld,"
		    "\"cache_read_input_tokens\":%lld", r->k.cache_creation, r->k.cache_read);
	buf_printf(b, ",\"output_tokens\":%lld}", output_tokens);
}

/* POST /v1/messages without "stream": one Anthropic message. */
static void
resp_messages_json(struct conn *c)
{
	struct req *r = &c->req;
	char mid[96];

	api_id(c, "msg", mid, sizeof mid);
	resp_json_begin(c);
	buf_printf(&c->out, "{\"id\":\"%s\",\"type\":\"message\",\"role\":\"assistant\","
	    "\"model\":", mid);
	buf_model(&c->out, r);
	buf_puts(&c->out, ",\"content\":[{\"type\":\"text\",\"text\":\"");
	buf_tokens(&c->out, r->k.events);
	buf_puts(&c->out, "\"}],\"stop_reason\":\"end_turn\",\"stop_sequence\":null");
	if (!r->k.ignore_usage) {
		buf_puts(&c->out, ",");
		buf_anthropic_usage(&c->out, r, r->completion_tokens);
	}
	buf_puts(&c->out, "}");
	resp_json_end(c, 200);
	resp_cut_after_head(c);
}

/* An error the stub makes, in the shape of the API asked: Anthropic's on /v1/messages. */
static void
resp_stub_error(struct conn *c, int status, const char *msg)
{
	if (c->req.api != ROUTE_MESSAGES) {
		resp_error(c, status, msg);
		return;
	}
	resp_json_begin(c);
	buf_puts(&c->out, "{\"type\":\"error\",\"error\":{\"type\":\"stub\",\"message\":");
	buf_json_str(&c->out, msg, strlen(msg));
	buf_puts(&c->out, "}}");
	resp_json_end(c, status);
}

/* vLLM's answer for a response id it does not hold (previous_response_id or path). */
static void
resp_not_stored(struct conn *c, const char *id, size_t n)
{
	resp_json_begin(c);
	buf_puts(&c->out, "{\"error\":{\"message\":\"Response with id '");
	/* The id inside a JSON string: escape it, drop the quotes buf_json_str adds. */
	if (buf_reserve(&c->out, 0) == 0) {
		size_t at = c->out.len;

		buf_json_str(&c->out, id, n);
		if (!c->out.err) {
			memmove(c->out.data + at, c->out.data + at + 1, c->out.len - at - 2);
			c->out.len -= 2;
		}
	}
	buf_puts(&c->out, "' not found.\",\"type\":\"invalid_request_error\","
	    "\"param\":\"response_id\",\"code\":404}}");
	resp_json_end(c, 404);
}

/* GET, DELETE /v1/responses/{id}, POST .../cancel, GET .../input_items. */
static void
resp_stored(struct conn *c)
{
	struct req *r = &c->req;
	struct stub *ctx = c->ctx;
	const char *id = r->arena.data + r->id_off;
	struct rs_ent *e = rs_find(ctx, id, r->id_len);

	if (e == NULL) {
		ctx->st.retrieve_missing++;
		resp_not_stored(c, id, r->id_len);
		return;
	}
	ctx->st.retrieve_found++;
	resp_json_begin(c);
	switch (r->route) {
	case ROUTE_RESP_DELETE:
		buf_puts(&c->out, "{\"id\":");
		buf_json_str(&c->out, e->id, e->idlen);
		buf_puts(&c->out, ",\"object\":\"response.deleted\",\"deleted\":true}");
		rs_drop(ctx, e);
		ctx->st.responses_deleted++;
		break;
	case ROUTE_RESP_ITEMS:
		buf_puts(&c->out, "{\"object\":\"list\",\"data\":");
		buf_append(&c->out, e->items, e->itemslen);
		buf_printf(&c->out, ",\"first_id\":");
		buf_puts(&c->out, e->first_id);
		buf_puts(&c->out, ",\"last_id\":");
		buf_puts(&c->out, e->last_id);
		buf_puts(&c->out, ",\"has_more\":false}");
		break;
	default:	/* GET, cancel: the stored object */
		buf_append(&c->out, e->obj, e->objlen);
		break;
	}
	resp_json_end(c, 200);
}

/* POST /v1/embeddings: the "data" built at dispatch. */
static void
resp_embeddings(struct conn *c)
{
	struct req *r = &c->req;

	resp_json_begin(c);
	buf_puts(&c->out, "{\"object\":\"list\",\"data\":");
	buf_append(&c->out, r->emb, r->emb_len);
	buf_puts(&c->out, ",\"model\":");
	buf_model(&c->out, r);
	if (!r->k.ignore_usage)
		buf_printf(&c->out, ",\"usage\":{\"prompt_tokens\":%lld,\"total_tokens\":%lld}",
		    r->prompt_tokens, r->prompt_tokens);
	buf_puts(&c->out, "}");
	resp_json_end(c, 200);
	resp_cut_after_head(c);
}

/* Start an SSE event unit: CHUNK_ROOM, then "event: TYPE\ndata: ". */
static void
api_event_begin(struct conn *c, const char *type)
{
	struct buf *b = &c->out;

	b->len = 0;
	b->err = 0;
	buf_fill(b, ' ', CHUNK_ROOM);
	buf_printf(b, "event: %s\ndata: ", type);
}

/* End it ("\n\n"), frame it as one chunk. */
static void
api_event_end(struct conn *c, int token)
{
	buf_append(&c->out, "\n\n\r\n", 4);
	if (c->out.err)
		return;
	resp_chunk_frame(c);
	c->units++;
	c->unit_token = token;
	if (token)
		c->events_sent++;
}

/* The Responses stream's unit u (== its sequence_number); pinned in the header comment. */
static void
responses_unit(struct conn *c, long long u)
{
	struct req *r = &c->req;
	struct buf *b = &c->out;
	long long e = r->k.events;
	char mid[96];
	static const char *const pre[] = { "response.created", "response.in_progress",
	    "response.output_item.added", "response.content_part.added" };
	static const char *const post[] = { "response.output_text.done",
	    "response.content_part.done", "response.output_item.done", "response.completed" };
	const char *type = u < 4 ? pre[u] : u < 4 + e ? "response.output_text.delta" :
	    post[u - 4 - e];

	api_id(c, "msg", mid, sizeof mid);
	api_event_begin(c, type);
	buf_printf(b, "{\"type\":\"%s\",\"sequence_number\":%lld", type, u);
	if (u == 0 || u == 1 || u == 7 + e) {
		buf_puts(b, ",\"response\":");
		buf_response(b, c, u == 7 + e);
		if (u == 7 + e)
			resp_keep(c);
	} else if (u == 2 || u == 6 + e) {
		buf_puts(b, ",\"output_index\":0,\"item\":");
		buf_output_item(b, c, u == 6 + e);
	} else {
		if (u >= 4 && u < 4 + e)
			buf_stamp(b, r);
		buf_printf(b, ",\"item_id\":\"%s\",\"output_index\":0,\"content_index\":0,", mid);
		if (u == 3 || u == 5 + e) {
			buf_puts(b, "\"part\":");
			buf_output_text(b, r, u == 5 + e);
		} else if (u == 4 + e) {
			buf_puts(b, "\"text\":\"");
			buf_tokens(b, e);
			buf_puts(b, "\",\"logprobs\":[]");
		} else
			buf_printf(b, "\"delta\":\"tok%lld \",\"logprobs\":[]", u - 4);
	}
	buf_puts(b, "}");
	api_event_end(c, u >= 4 && u < 4 + e);
}

/* The Messages stream's unit u; pinned in the header comment. */
static void
messages_unit(struct conn *c, long long u)
{
	struct req *r = &c->req;
	struct buf *b = &c->out;
	long long e = r->k.events;
	char mid[96];

	if (u == 0) {
		api_id(c, "msg", mid, sizeof mid);
		api_event_begin(c, "message_start");
		buf_printf(b, "{\"type\":\"message_start\",\"message\":{\"id\":\"%s\","
		    "\"type\":\"message\",\"role\":\"assistant\",\"model\":", mid);
		buf_model(b, r);
		buf_puts(b, ",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null");
		if (!r->k.ignore_usage) {
			buf_puts(b, ",");
			buf_anthropic_usage(b, r, 1);
		}
		buf_puts(b, "}}");
	} else if (u == 1) {
		api_event_begin(c, "content_block_start");
		buf_puts(b, "{\"type\":\"content_block_start\",\"index\":0,"
		    "\"content_block\":{\"type\":\"text\",\"text\":\"\"}}");
	} else if (u == 2) {
		api_event_begin(c, "ping");
		buf_puts(b, "{\"type\": \"ping\"}");
	} else if (u < 3 + e) {
		api_event_begin(c, "content_block_delta");
		buf_puts(b, "{\"type\":\"content_block_delta\",\"index\":0");
		buf_stamp(b, r);
		buf_printf(b, ",\"delta\":{\"type\":\"text_delta\",\"text\":\"tok%lld \"}}", u - 3);
	} else if (u == 3 + e) {
		api_event_begin(c, "content_block_stop");
		buf_puts(b, "{\"type\":\"content_block_stop\",\"index\":0}");
	} else if (u == 4 + e) {
		api_event_begin(c, "message_delta");
		buf_puts(b, "{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\","
		    "\"stop_sequence\":null}");
		if (!r->k.ignore_usage)
			buf_printf(b, ",\"usage\":{\"output_tokens\":%lld}", r->completion_tokens);
		buf_puts(b, "}");
	} else {
		api_event_begin(c, "message_stop");
		buf_puts(b, "{\"type\":\"message_stop\"}");
	}
	api_event_end(c, u >= 3 && u < 3 + e);
}

/* The next unit of a Responses / Messages stream, or its last chunk (no [DONE]). */
static void
api_stream_next(struct conn *c)
{
	int responses = c->req.route == ROUTE_RESPONSES;
	long long total = c->req.k.events + (responses ? 8 : 6);

	if (c->units < total) {
		if (responses)
			responses_unit(c, c->units);
		else
			messages_unit(c, c->units);
		return;
	}
	c->out.len = 0;
	c->out.err = 0;
	c->out_pos = 0;
	buf_puts(&c->out, "0\r\n\r\n");
	c->unit_token = 0;
	c->trailer_sent = 1;
}

static void
resp_stream_head(struct conn *c)
{
	static const char head[] =
	    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
	    "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n";

	c->out.len = 0;
	c->out.err = 0;
	c->out_pos = 0;
	buf_append(&c->out, head, sizeof head - 1);
	c->kind = RESP_STREAM;
	c->req.status = 200;
	c->events_sent = 0;
	c->usage_sent = 0;
	c->trailer_sent = 0;
	c->units = 0;
	c->unit_token = 0;
	c->ctx->st.streams_started++;
}

/* Event number events_sent as one chunk; the layout is pinned in the header comment. */
/* out holds CHUNK_ROOM bytes, then one event and "\r\n": put the chunk size in front. */
static void
resp_chunk_frame(struct conn *c)
{
	struct buf *b = &c->out;
	char pre[CHUNK_ROOM];
	size_t ev_len;
	int pl;

	ev_len = b->len - CHUNK_ROOM - 2;
	pl = snprintf(pre, sizeof pre, "%zx\r\n", ev_len);
	memcpy(b->data + CHUNK_ROOM - pl, pre, (size_t)pl);
	c->out_pos = CHUNK_ROOM - (size_t)pl;
}

/*
 * Event number events_sent as one chunk; the layout is pinned in the header comment.
 * /v1/completions events carry choices[0].text, chat events choices[0].delta.content.
 */
static void
resp_stream_event(struct conn *c)
{
	struct buf *b = &c->out;
	long long i = c->events_sent;
	int text = c->req.route == ROUTE_COMPLETIONS;
	const char *id = text ? "cmpl-stub" : "chatcmpl-stub";
	const char *obj = text ? "text_completion" : "chat.completion.chunk";
	const char *tail = c->req.send_usage && c->req.k.usage_null ?
	    "\",\"usage\":null}\n\n" : "\"}\n\n";
	char head[256], stamp[48], choice[96];
	size_t natural, pad, tail_len = strlen(tail);
	int hl;

	stamp[0] = '\0';
	if (c->req.k.stamp) {
		struct timespec ts;

		clock_gettime(CLOCK_MONOTONIC, &ts);
		snprintf(stamp, sizeof stamp, ",\"t\":%lld",
		    (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
	}
	if (text)
		snprintf(choice, sizeof choice, "{\"index\":0,\"text\":\"tok%lld \"}", i);
	else
		snprintf(choice, sizeof choice, "{\"index\":0,\"delta\":{\"content\":\"tok%lld \"}}",
		    i);
	hl = snprintf(head, sizeof head, "data: {\"id\":\"%s\",\"object\":\"%s\",%s"
	    "\"seq\":%lld%s,\"choices\":[%s],\"pad\":\"", id, obj,
	    c->req.k.model ? "\"model\":\"stub\"," : "", i, stamp, choice);
	natural = (size_t)hl + tail_len;
	pad = (size_t)c->req.k.event_size > natural ? (size_t)c->req.k.event_size - natural : 0;

	b->len = 0;
	b->err = 0;
	buf_fill(b, ' ', CHUNK_ROOM);
	buf_append(b, head, (size_t)hl);
	buf_fill(b, 'x', pad);
	buf_append(b, tail, tail_len);
	buf_append(b, "\r\n", 2);
	if (b->err)
		return;
	resp_chunk_frame(c);
	c->events_sent++;
}

/* The usage chunk, after the last event and before [DONE], as vLLM sends it. */
static void
resp_stream_usage(struct conn *c)
{
	struct buf *b = &c->out;
	int text = c->req.route == ROUTE_COMPLETIONS;

	b->len = 0;
	b->err = 0;
	buf_fill(b, ' ', CHUNK_ROOM);
	buf_printf(b, "data: {\"id\":\"%s\",\"object\":\"%s\",\"created\":0,"
	    "\"model\":\"stub\",\"choices\":[],", text ? "cmpl-stub" : "chatcmpl-stub",
	    text ? "text_completion" : "chat.completion.chunk");
	buf_usage(b, &c->req);
	buf_puts(b, "}\n\n\r\n");
	if (b->err)
		return;
	resp_chunk_frame(c);
	c->usage_sent = 1;
	c->ctx->st.usage_chunks++;
}

static void
resp_stream_trailer(struct conn *c)
{
	static const char trailer[] = "e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n";

	c->out.len = 0;
	c->out.err = 0;
	c->out_pos = 0;
	buf_append(&c->out, trailer, sizeof trailer - 1);
	c->trailer_sent = 1;
}

/* ------------------------------------------------------------------ I/O */

/* (Re)arm the connection's one timer; secs 0 means "next loop iteration". */
static void
conn_arm_timer(struct conn *c, double secs)
{
	ev_timer_stop(c->ctx->loop, &c->timer);
	ev_timer_set(&c->timer, secs, 0.);
	ev_timer_start(c->ctx->loop, &c->timer);
}

enum rd { RD_WAIT, RD_REQUEST, RD_CONTINUE, RD_BAD, RD_EOF };

static enum rd
conn_parse(struct conn *c, const char *data, size_t len, size_t *used)
{
	struct req *r = &c->req;
	enum http_errno e;

	*used = http_parser_execute(&c->parser, &parser_settings, data, len);
	e = HTTP_PARSER_ERRNO(&c->parser);
	if (c->parser.upgrade) {
		snprintf(r->errmsg, sizeof r->errmsg, "Upgrade and CONNECT are not supported");
		r->err_status = 400;
		return RD_BAD;
	}
	if (e == HPE_PAUSED)
		return RD_REQUEST;
	if (e != HPE_OK) {
		if (r->err_status == 0)
			r->err_status = e == HPE_HEADER_OVERFLOW ? 431 : 400;
		switch (r->err_status) {
		case 413:
			snprintf(r->errmsg, sizeof r->errmsg, "request body over %d bytes", BODY_CAP);
			break;
		case 414:
			snprintf(r->errmsg, sizeof r->errmsg, "URL over %d bytes", URL_CAP);
			break;
		case 431:
			snprintf(r->errmsg, sizeof r->errmsg, "headers too large or over %d of them",
			    MAX_HEADERS);
			break;
		default:
			snprintf(r->errmsg, sizeof r->errmsg, "bad request: %s", http_errno_name(e));
		}
		return RD_BAD;
	}
	if (r->expect_continue && !r->continue_sent) {
		r->continue_sent = 1;
		return RD_CONTINUE;
	}
	return RD_WAIT;
}

/*
 * Read and parse until a request is complete. Bytes past the end of that request
 * stay in c->in (pipelining); the parser is paused until conn_drive resumes it.
 */
static enum rd
conn_read_request(struct conn *c)
{
	struct stub *ctx = c->ctx;
	size_t used;
	ssize_t n;
	enum rd r;
	int i;

	if (c->in.len > 0) {
		r = conn_parse(c, c->in.data, c->in.len, &used);
		buf_consume(&c->in, used);
		if (r != RD_WAIT)
			return r;
	}
	/* Here c->in is empty, so whatever a read leaves over fits in it. */
	for (i = 0; i < READS_PER_PASS; i++) {
		n = recv(c->fd, ctx->scratch, sizeof ctx->scratch, 0);
		if (n > 0) {
			r = conn_parse(c, ctx->scratch, (size_t)n, &used);
			if (r == RD_REQUEST && used < (size_t)n)
				buf_append(&c->in, ctx->scratch + used, (size_t)n - used);
			if (r != RD_WAIT)
				return r;
			continue;
		}
		if (n == 0)
			return RD_EOF;
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return RD_WAIT;
		return RD_EOF;
	}
	return RD_WAIT;	/* level-triggered: EV_READ calls again */
}

/*
 * While a response is in progress, reading is only for noticing that the peer
 * left; whatever it pipelines meanwhile is kept, up to IN_CAP.
 */
static void
conn_watch_peer(struct conn *c)
{
	ssize_t n;
	size_t room;
	int i;

	for (i = 0; i < READS_PER_PASS; i++) {
		room = IN_CAP - c->in.len;
		if (room == 0) {
			/* Cannot see a close now; the next write error will. */
			ev_io_stop(c->ctx->loop, &c->rio);
			c->rio_stopped = 1;
			return;
		}
		if (room > 16384)
			room = 16384;
		if (buf_reserve(&c->in, room) < 0) {
			conn_set_closing(c, OUT_CUT);
			return;
		}
		n = recv(c->fd, c->in.data + c->in.len, room, 0);
		if (n > 0) {
			c->in.len += (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return;
		conn_set_closing(c, OUT_ABORTED_BY_CLIENT);
		return;
	}
}

enum wr { WR_DONE, WR_BLOCKED, WR_GONE };

/* Write out[out_pos..len). On EAGAIN keep the rest and wait for EV_WRITE. */
static enum wr
conn_flush(struct conn *c)
{
	struct stub *ctx = c->ctx;
	ssize_t n;

	while (c->out_pos < c->out.len) {
		n = send(c->fd, c->out.data + c->out_pos, c->out.len - c->out_pos,
		    MSG_NOSIGNAL);
		if (n > 0) {
			c->out_pos += (size_t)n;
			if (c->req.counted) {
				ctx->st.bytes_sent += (uint64_t)n;
				if (c->req.tag != NULL)
					c->req.tag->bytes_sent += (uint64_t)n;
			}
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			ctx->st.blocked_writes++;
			ev_timer_stop(ctx->loop, &c->timer);
			ev_io_start(ctx->loop, &c->wio);
			return WR_BLOCKED;
		}
		return WR_GONE;
	}
	return WR_DONE;
}

/* ------------------------------------------------------------------ the runner model */

/*
 * A completion the stub answers 200 (chat or not, stream or not, no
 * X-Stub-Status) passes through a model of an inference engine's scheduler
 * before the knobs that wait (hang, delay) and the response:
 *   runner_admit      at dispatch: take a batch slot, or wait in ctx->waitq (FIFO)
 *   runner_start      with a slot: find the prompt's cached prefix, arm the TTFT
 *                     timer (CONN_PREFILL); shared mode: queue its compute in
 *                     the lane (ctx->laneq)
 *   runner_prefilled  the timer fired: cache the prompt's blocks, then serve
 *   runner_release    from req_finish: free the slot, hand it to the queue's head;
 *                     a prefill cut short gives its lane time back (lane_leave)
 * The slot is held until the response is written or the peer leaves. With the
 * options off (the default) a request takes a slot at once and prefills in no
 * time within the same step: nothing changes but the gauges.
 */

#define FNV_OFFSET 0xcbf29ce484222325ULL
#define FNV_PRIME  0x100000001b3ULL

/* splitmix64's finalizer: FNV alone leaves the low bits (the bucket) weak. */
static uint64_t
mix64(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ULL;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebULL;
	x ^= x >> 31;
	return x;
}

static void
pc_init(struct pcache *pc, uint32_t cap)
{
	uint32_t nb = 1;

	memset(pc, 0, sizeof *pc);
	pc->mru = pc->lru = PC_NIL;
	if (cap == 0)
		return;
	while (nb < 2 * cap)
		nb <<= 1;
	pc->ent = calloc(cap, sizeof *pc->ent);
	pc->bucket = malloc((size_t)nb * sizeof *pc->bucket);
	if (pc->ent == NULL || pc->bucket == NULL)
		die("out of memory for a prefix cache of %" PRIu32 " blocks", cap);
	pc->cap = cap;
	pc->mask = nb - 1;
	pc_clear(pc);
}

/*
 * Cuts a prompt into blocks of ctx->block bytes as its pieces arrive. Block
 * i's FNV-1a starts from block i-1's hash, so it names the whole prefix up to
 * it; the bytes after the last whole block are never cached.
 */
struct prompt_hash {
	struct req	*r;
	size_t		 block, fill, max;
	uint64_t	 cur;
	struct buf	*copy;		/* Responses: the prompt text is kept here too */
};

static void
prompt_feed(struct prompt_hash *ph, const char *s, size_t n)
{
	struct req *r = ph->r;
	size_t i;

	r->prompt_bytes += n;
	if (ph->copy != NULL)
		buf_append(ph->copy, s, n);
	if (r->blocks == NULL)
		return;
	for (i = 0; i < n; i++) {
		ph->cur = (ph->cur ^ (unsigned char)s[i]) * FNV_PRIME;
		if (++ph->fill < ph->block)
			continue;
		ph->cur = mix64(ph->cur);
		if (r->nblocks < ph->max)
			r->blocks[r->nblocks++] = ph->cur;
		ph->fill = 0;
	}
}

/* A content value: a string, or an array of strings or {"text":...} parts. */
static void
prompt_add(struct prompt_hash *ph, json_t *v)
{
	json_t *x;
	size_t i;

	if (json_is_string(v)) {
		prompt_feed(ph, json_string_value(v), json_string_length(v));
		return;
	}
	if (!json_is_array(v))
		return;
	for (i = 0; i < json_array_size(v); i++) {
		x = json_array_get(v, i);
		if (json_is_object(x))
			x = json_object_get(x, "text");
		if (json_is_string(x))
			prompt_feed(ph, json_string_value(x), json_string_length(x));
	}
}

/*
 * Set r->prompt_bytes and, with a prefix cache, r->blocks (owned by r) from a
 * parsed completion body: its messages[].content concatenated, or its prompt;
 * Messages: "system" first; Responses: pre (the conversation so far, from
 * previous_response_id), "instructions", then "input" (a string, or items:
 * strings and the "content" of objects); embeddings: "input".
 */
static void
req_prompt(struct stub *ctx, struct req *r, json_t *root, const char *pre, size_t prelen)
{
	struct prompt_hash ph;
	json_t *msgs, *m;
	size_t i;

	memset(&ph, 0, sizeof ph);
	ph.r = r;
	ph.block = ctx->block;
	ph.cur = FNV_OFFSET;
	/* Decoded strings are never longer than the body: max bounds the blocks. */
	ph.max = (r->body.len + prelen) / ctx->block;
	if (ctx->pc.cap > 0 && ph.max > 0 &&
	    (r->blocks = malloc(ph.max * sizeof *r->blocks)) == NULL)
		stub_log(ctx, "out of memory hashing a prompt; it is served uncached");
	if (r->route == ROUTE_RESPONSES) {
		if (r->store)
			ph.copy = &r->context;
		if (prelen > 0)
			prompt_feed(&ph, pre, prelen);
		prompt_add(&ph, json_object_get(root, "instructions"));
		msgs = json_object_get(root, "input");
		if (!json_is_array(msgs)) {
			prompt_add(&ph, msgs);
			return;
		}
		for (i = 0; i < json_array_size(msgs); i++) {
			m = json_array_get(msgs, i);
			prompt_add(&ph, json_is_object(m) ? json_object_get(m, "content") : m);
		}
		return;
	}
	if (r->route == ROUTE_EMBEDDINGS) {
		prompt_add(&ph, json_object_get(root, "input"));
		return;
	}
	if (r->route == ROUTE_MESSAGES)
		prompt_add(&ph, json_object_get(root, "system"));
	msgs = json_object_get(root, "messages");
	if (json_is_array(msgs)) {
		for (i = 0; i < json_array_size(msgs); i++) {
			m = json_array_get(msgs, i);
			if (json_is_object(m))
				prompt_add(&ph, json_object_get(m, "content"));
		}
	} else
		prompt_add(&ph, json_object_get(root, "prompt"));
}

/* The knobs that wait before the head (hang, delay), then the response. */
static void
conn_serve(struct conn *c)
{
	struct req *r = &c->req;

	if (r->k.hang) {
		conn_set_state(c, CONN_HANG);
		return;
	}
	if (r->k.delay_ms > 0) {
		conn_arm_timer(c, (double)r->k.delay_ms / 1000.0);
		conn_set_state(c, CONN_DELAY);
		return;
	}
	conn_set_state(c, CONN_RESPOND);
}

/*
 * The prefill is over (the first token is due): its blocks are cached now,
 * tail first, so that a prompt's shared head is the last of it to be evicted
 * (vLLM frees a sequence's blocks in reverse order for the same reason).
 */
/*
 * Take c out of the compute lane (its prefill ended, or its client left).
 * When its compute had not ended, the rest of it is given back: every
 * prefill behind it starts and ends that much earlier, and its timer is
 * re-armed.
 */
static void
lane_leave(struct conn *c, double now)
{
	struct stub *ctx = c->ctx;
	struct req *r = &c->req;
	struct conn *n;
	double rest;

	if (!r->in_lane)
		return;
	rest = r->t_lane_end - (now > r->t_lane_start ? now : r->t_lane_start);
	ev_now_update(ctx->loop);
	for (n = TAILQ_NEXT(c, lentry); n != NULL && rest > 0 && !ctx->stopping;
	    n = TAILQ_NEXT(n, lentry)) {
		double due;

		n->req.t_lane_start -= rest;
		n->req.t_lane_end -= rest;
		due = n->req.t_lane_end + ctx->ttft_base_ms / 1000.0 - now;
		conn_arm_timer(n, due > 0 ? due : 0.);
	}
	if (rest > 0)
		ctx->lane_free -= rest;
	TAILQ_REMOVE(&ctx->laneq, c, lentry);
	r->in_lane = 0;
}

static void
runner_prefilled(struct conn *c)
{
	struct stub *ctx = c->ctx;
	struct req *r = &c->req;
	struct last_prefill *lp = &ctx->last_prefill;
	struct prefill_rec *rec = &ctx->ring[ctx->ring_next];
	double lane_ms = 0, now = mono_now();
	size_t i;

	if (r->in_lane) {
		lane_ms = (r->t_lane_start - r->t_slot) * 1000.0;
		lane_leave(c, now);
	}
	if (r->prefilling) {
		r->prefilling = 0;
		ctx->prefilling--;
	}
	for (i = r->nblocks; i-- > 0; )
		pc_insert(&ctx->pc, r->blocks[i]);
	ctx->rs.prefills++;
	ctx->rs.lane_ms_total += lane_ms;
	lp->valid = 1;
	lp->prompt_bytes = r->prompt_bytes;
	lp->blocks = r->nblocks;
	lp->hit_blocks = r->hit_blocks;
	lp->hit_bytes = r->hit_blocks * ctx->block;
	lp->queue_ms = (r->t_slot - r->t_dispatch) * 1000.0;
	lp->lane_ms = lane_ms;
	lp->prefill_ms = r->prefill_ms;
	lp->ttft_ms = (now - r->t_dispatch) * 1000.0;
	lp->slot_ms = r->t_slot * 1000.0;
	rec->prompt_bytes = lp->prompt_bytes;
	rec->hit_bytes = lp->hit_bytes;
	rec->queue_ms = lp->queue_ms;
	rec->lane_ms = lane_ms;
	rec->prefill_ms = lp->prefill_ms;
	rec->ttft_ms = lp->ttft_ms;
	rec->slot_ms = lp->slot_ms;
	ctx->ring_next = (ctx->ring_next + 1) % PREFILL_RING;
	if (ctx->ring_n < PREFILL_RING)
		ctx->ring_n++;
	free(r->blocks);
	r->blocks = NULL;
	conn_serve(c);
}

/*
 * Give c a batch slot: find its cached prefix (the longest run of leading
 * blocks in the cache) and start its prefill. wake: called for another
 * connection's release, so c's machine must be woken by its timer even for a
 * zero prefill; otherwise a zero prefill goes on in this step. now: the time
 * the slot is given (the dispatch time when there was no wait).
 */
static void
runner_start(struct conn *c, int wake, double now)
{
	struct stub *ctx = c->ctx;
	struct req *r = &c->req;
	size_t i, hit_bytes;

	r->slot = SLOT_RUNNING;
	ctx->running_blocks += r->nblocks;
	if (++ctx->running > ctx->rs.max_running)
		ctx->rs.max_running = ctx->running;
	r->t_slot = now;
	for (i = 0; i < r->nblocks && pc_find(&ctx->pc, r->blocks[i]) != PC_NIL; i++)
		;
	r->hit_blocks = i;
	/*
	 * The prefix in use is refreshed now (a runner holds it while the request
	 * runs), head last: inserting this prompt's new tail later must not evict it.
	 */
	while (i-- > 0)
		pc_insert(&ctx->pc, r->blocks[i]);
	i = r->hit_blocks;
	hit_bytes = i * ctx->block;
	ctx->rs.prompt_bytes += r->prompt_bytes;
	ctx->rs.prompt_bytes_hit += hit_bytes;
	ctx->rs.prompt_blocks += r->nblocks;
	ctx->rs.hit_blocks += i;
	if (i > 0)
		ctx->rs.hit_requests++;
	r->work_ms = ctx->ttft_ms_per_kib * (double)(r->prompt_bytes - hit_bytes) / 1024.0;
	r->prefill_ms = ctx->ttft_base_ms + r->work_ms;
	ctx->rs.queue_ms_total += (r->t_slot - r->t_dispatch) * 1000.0;
	ctx->rs.prefill_ms_total += r->prefill_ms;
	if (r->prefill_ms > 0 || wake) {
		double due = r->prefill_ms / 1000.0;

		if (ctx->prefill_shared) {
			/* Its compute follows the lane's; base runs after its own. */
			r->t_lane_start = ctx->lane_free > now ? ctx->lane_free : now;
			r->t_lane_end = r->t_lane_start + r->work_ms / 1000.0;
			ctx->lane_free = r->t_lane_end;
			TAILQ_INSERT_TAIL(&ctx->laneq, c, lentry);
			r->in_lane = 1;
			due = r->t_lane_end + ctx->ttft_base_ms / 1000.0 - now;
		}
		r->prefilling = 1;
		ctx->prefilling++;
		/* From now, not from the loop's cached time: never shorter than modelled. */
		ev_now_update(ctx->loop);
		conn_arm_timer(c, due);
		conn_set_state(c, CONN_PREFILL);
	} else
		runner_prefilled(c);
}

/* At dispatch of a completion to serve: a slot now, or wait for one. */
static void
runner_admit(struct conn *c)
{
	struct stub *ctx = c->ctx;

	c->req.t_dispatch = mono_now();
	if (ctx->batch > 0 && ctx->running >= (uint64_t)ctx->batch) {
		c->req.slot = SLOT_WAITING;
		TAILQ_INSERT_TAIL(&ctx->waitq, c, wentry);
		if (++ctx->waiting > ctx->rs.max_waiting)
			ctx->rs.max_waiting = ctx->waiting;
		conn_set_state(c, CONN_QUEUED);
		return;
	}
	runner_start(c, 0, c->req.t_dispatch);
}

/*
 * From req_finish: leave the queue, or free the slot and hand it to the head
 * of the queue. The next request only gets its state and timer set here; its
 * own timer runs its machine.
 */
static void
runner_release(struct conn *c)
{
	struct stub *ctx = c->ctx;
	struct req *r = &c->req;
	struct conn *next;

	if (r->slot == SLOT_WAITING) {
		TAILQ_REMOVE(&ctx->waitq, c, wentry);
		ctx->waiting--;
	} else if (r->slot == SLOT_RUNNING) {
		lane_leave(c, mono_now());
		if (r->prefilling) {
			r->prefilling = 0;
			ctx->prefilling--;
		}
		ctx->running--;
		ctx->running_blocks -= r->nblocks;
		while (!ctx->stopping && (next = TAILQ_FIRST(&ctx->waitq)) != NULL &&
		    (ctx->batch == 0 || ctx->running < (uint64_t)ctx->batch)) {
			TAILQ_REMOVE(&ctx->waitq, next, wentry);
			ctx->waiting--;
			runner_start(next, 1, mono_now());
		}
	}
	r->slot = SLOT_NONE;
}

/* ------------------------------------------------------------------ the machine */

static enum route
route_of(const struct req *r, const char *path, size_t plen)
{
	unsigned m = r->method;

#define PATH_IS(s) (plen == sizeof(s) - 1 && memcmp(path, s, plen) == 0)
	if (PATH_IS("/v1/chat/completions"))
		return m == HTTP_POST ? ROUTE_CHAT : ROUTE_NOT_FOUND;
	if (PATH_IS("/v1/completions"))
		return m == HTTP_POST ? ROUTE_COMPLETIONS : ROUTE_NOT_FOUND;
	if (PATH_IS("/v1/responses"))
		return m == HTTP_POST ? ROUTE_RESPONSES : ROUTE_NOT_FOUND;
	if (PATH_IS("/v1/messages"))
		return m == HTTP_POST ? ROUTE_MESSAGES : ROUTE_NOT_FOUND;
	if (PATH_IS("/v1/messages/count_tokens"))
		return m == HTTP_POST ? ROUTE_COUNT_TOKENS : ROUTE_NOT_FOUND;
	if (PATH_IS("/v1/embeddings"))
		return m == HTTP_POST ? ROUTE_EMBEDDINGS : ROUTE_NOT_FOUND;
	if (PATH_IS("/v1/echo"))
		return m == HTTP_GET || m == HTTP_POST || m == HTTP_PUT || m == HTTP_DELETE ?
		    ROUTE_ECHO : ROUTE_NOT_FOUND;
	if (PATH_IS("/v1/models"))
		return m == HTTP_GET ? ROUTE_MODELS : ROUTE_NOT_FOUND;
	if (PATH_IS("/stub/stats"))
		return m == HTTP_GET ? ROUTE_STATS : ROUTE_NOT_FOUND;
	if (PATH_IS("/stub/reset"))
		return m == HTTP_POST ? ROUTE_RESET : ROUTE_NOT_FOUND;
	if (PATH_IS("/stub/last"))
		return m == HTTP_GET ? ROUTE_LAST : ROUTE_NOT_FOUND;
	if (PATH_IS("/stub/prefills"))
		return m == HTTP_GET ? ROUTE_PREFILLS : ROUTE_NOT_FOUND;
	if (PATH_IS("/health"))
		return m == HTTP_GET ? ROUTE_HEALTH : ROUTE_NOT_FOUND;
	if (PATH_IS("/metrics"))
		return m == HTTP_GET ? ROUTE_METRICS : ROUTE_NOT_FOUND;
	if (PATH_IS("/stub/health"))
		return m == HTTP_POST ? ROUTE_CTL_HEALTH : ROUTE_NOT_FOUND;
	if (PATH_IS("/stub/busy"))
		return m == HTTP_POST ? ROUTE_CTL_BUSY : ROUTE_NOT_FOUND;
	if (PATH_IS("/stub/slow-start"))
		return m == HTTP_POST ? ROUTE_CTL_SLOW_START : ROUTE_NOT_FOUND;
#undef PATH_IS
	return ROUTE_NOT_FOUND;
}

/*
 * /v1/responses/{id} (GET, DELETE), /v1/responses/{id}/cancel (POST),
 * /v1/responses/{id}/input_items (GET): the id is one non-empty path segment,
 * taken as is (not percent-decoded). Sets r->id_off, r->id_len.
 */
static enum route
route_stored(struct req *r, const char *path, size_t plen)
{
	static const char pre[] = "/v1/responses/";
	const char *id = path + sizeof pre - 1, *slash;
	size_t n = plen - (sizeof pre - 1), rest;
	unsigned m = r->method;

	if (plen <= sizeof pre - 1 || memcmp(path, pre, sizeof pre - 1) != 0)
		return ROUTE_NOT_FOUND;
	slash = memchr(id, '/', n);
	rest = slash ? n - (size_t)(slash - id) : 0;
	n -= rest;
	if (n == 0)
		return ROUTE_NOT_FOUND;
	r->id_off = (size_t)(id - r->arena.data);
	r->id_len = n;
	if (rest == 0)
		return m == HTTP_GET ? ROUTE_RESP_GET : m == HTTP_DELETE ? ROUTE_RESP_DELETE :
		    ROUTE_NOT_FOUND;
	if (rest == 7 && memcmp(slash, "/cancel", 7) == 0)
		return m == HTTP_POST ? ROUTE_RESP_CANCEL : ROUTE_NOT_FOUND;
	if (rest == 12 && memcmp(slash, "/input_items", 12) == 0)
		return m == HTTP_GET ? ROUTE_RESP_ITEMS : ROUTE_NOT_FOUND;
	return ROUTE_NOT_FOUND;
}

/* A POST the runner model serves (and X-Stub-Status, loading, busy refuse). */
static int
route_completion(enum route rt)
{
	return rt == ROUTE_CHAT || rt == ROUTE_COMPLETIONS || rt == ROUTE_RESPONSES ||
	    rt == ROUTE_MESSAGES || rt == ROUTE_EMBEDDINGS;
}

/*
 * A completion request's body, before anything is answered: keep it for GET
 * /stub/last and note (and count) whether it asks for the usage chunk, which
 * takes a JSON object body with "stream_options":{"include_usage":true}.
 */
/*
 * A bool as vLLM reads one (pydantic, lax mode): true/false, the integers
 * 1/0, the floats 1.0/0.0, and the strings "1" "0" and, in any case, "t" "y"
 * "on" "yes" "true" / "f" "n" "no" "off" "false". 1 true, 0 false, -1 a
 * value the runner refuses (or null, absent: the caller's default).
 */
static int
lax_bool(const json_t *v)
{
	static const char *const yes[] = { "t", "y", "on", "yes", "true" };
	static const char *const no[] = { "f", "n", "no", "off", "false" };
	const char *s;
	size_t i;

	if (json_is_boolean(v))
		return json_is_true(v);
	if (json_is_integer(v))
		return json_integer_value(v) == 1 ? 1 : json_integer_value(v) == 0 ? 0 : -1;
	if (json_is_real(v))
		return json_real_value(v) == 1.0 ? 1 : json_real_value(v) == 0.0 ? 0 : -1;
	if (!json_is_string(v))
		return -1;
	s = json_string_value(v);
	if (json_string_length(v) != strlen(s))
		return -1;
	if (strcmp(s, "1") == 0)
		return 1;
	if (strcmp(s, "0") == 0)
		return 0;
	for (i = 0; i < sizeof yes / sizeof yes[0]; i++) {
		if (strcasecmp(s, yes[i]) == 0)
			return 1;
		if (strcasecmp(s, no[i]) == 0)
			return 0;
	}
	return -1;
}

/* Copy a JSON string value; NULL when v is not a string (or out of memory). */
static char *
json_strdup(json_t *v, size_t *len)
{
	if (!json_is_string(v))
		return NULL;
	*len = json_string_length(v);
	return memdup(json_string_value(v), *len);
}

/* A JSON value of an item's "id": "\"ID\"" or "null", malloc'd. */
static char *
item_id_json(json_t *item)
{
	json_t *id = json_is_object(item) ? json_object_get(item, "id") : NULL;
	struct buf b;

	if (!json_is_string(id))
		return strdup("null");
	buf_init(&b, BODY_CAP);
	buf_json_str(&b, json_string_value(id), json_string_length(id));
	buf_append(&b, "", 1);
	if (b.err) {
		buf_free(&b);
		return NULL;
	}
	return b.data;
}

static void
base64_append(struct buf *b, const unsigned char *p, size_t n)
{
	static const char tab[] =
	    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	size_t i;
	char q[4];

	for (i = 0; i < n; i += 3) {
		unsigned v = (unsigned)p[i] << 16 | (i + 1 < n ? (unsigned)p[i + 1] << 8 : 0) |
		    (i + 2 < n ? p[i + 2] : 0);

		q[0] = tab[v >> 18 & 63];
		q[1] = tab[v >> 12 & 63];
		q[2] = i + 1 < n ? tab[v >> 6 & 63] : '=';
		q[3] = i + 2 < n ? tab[v & 63] : '=';
		buf_append(b, q, 4);
	}
}

/* One embedding: [N, I, 0.5, -0.25] as JSON floats, or their float32 LE in base64. */
static void
emb_item(struct buf *b, long long n, size_t i, int base64)
{
	float f[4] = { (float)n, (float)i, 0.5f, -0.25f };
	unsigned char raw[16];
	size_t k;

	buf_puts(b, i ? ",{\"object\":\"embedding\",\"embedding\":" :
	    "{\"object\":\"embedding\",\"embedding\":");
	if (base64) {
		for (k = 0; k < 4; k++) {
			uint32_t u;

			memcpy(&u, &f[k], 4);
			raw[4 * k] = (unsigned char)u;
			raw[4 * k + 1] = (unsigned char)(u >> 8);
			raw[4 * k + 2] = (unsigned char)(u >> 16);
			raw[4 * k + 3] = (unsigned char)(u >> 24);
		}
		buf_puts(b, "\"");
		base64_append(b, raw, sizeof raw);
		buf_puts(b, "\"");
	} else
		buf_printf(b, "[%lld.0,%zu.0,0.5,-0.25]", n, i);
	buf_printf(b, ",\"index\":%zu}", i);
}

/*
 * The "data" of an embeddings answer from "input": a string (N = its bytes),
 * an array of integers (one token array, N = its length), or an array of
 * strings and token arrays (one embedding each). r->emb stays NULL otherwise.
 */
static void
emb_build(struct req *r, json_t *root)
{
	json_t *in = json_object_get(root, "input"), *x, *fmt;
	struct buf b;
	size_t i;

	fmt = json_object_get(root, "encoding_format");
	r->emb_base64 = json_is_string(fmt) && strcmp(json_string_value(fmt), "base64") == 0;
	buf_init(&b, OUT_CAP / 2);
	buf_puts(&b, "[");
	if (json_is_string(in))
		emb_item(&b, (long long)json_string_length(in), 0, r->emb_base64);
	else if (json_is_array(in) && json_array_size(in) > 0 &&
	    json_is_integer(json_array_get(in, 0)))
		emb_item(&b, (long long)json_array_size(in), 0, r->emb_base64);
	else if (json_is_array(in)) {
		for (i = 0; i < json_array_size(in); i++) {
			x = json_array_get(in, i);
			if (json_is_string(x))
				emb_item(&b, (long long)json_string_length(x), i, r->emb_base64);
			else if (json_is_array(x))
				emb_item(&b, (long long)json_array_size(x), i, r->emb_base64);
			else {
				buf_free(&b);
				return;
			}
		}
	} else {
		buf_free(&b);
		return;
	}
	buf_puts(&b, "]");
	if (b.err) {
		buf_free(&b);
		return;
	}
	r->emb = b.data;
	r->emb_len = b.len;
}

/*
 * What a Responses, Messages or embeddings body says: its model, and for
 * Responses instructions, store, previous_response_id (looked up now: *pre
 * is the stored conversation a follow-up's prompt starts with) and the input
 * items GET .../input_items answers.
 */
static void
api_inspect(struct conn *c, json_t *root, const char **pre, size_t *prelen)
{
	struct req *r = &c->req;
	struct rs_ent *e;
	json_t *in;

	r->model = json_strdup(json_object_get(root, "model"), &r->model_len);
	if (r->route == ROUTE_EMBEDDINGS) {
		emb_build(r, root);
		return;
	}
	if (r->route != ROUTE_RESPONSES)
		return;
	r->instructions = json_strdup(json_object_get(root, "instructions"), &r->instr_len);
	r->store = lax_bool(json_object_get(root, "store")) != 0;
	r->prev_id = json_strdup(json_object_get(root, "previous_response_id"), &r->prev_len);
	if (r->prev_id != NULL && (e = rs_find(c->ctx, r->prev_id, r->prev_len)) != NULL) {
		r->prev_found = 1;
		*pre = e->context;
		*prelen = e->ctxlen;
	}
	if (!r->store)
		return;
	in = json_object_get(root, "input");
	if (json_is_string(in)) {
		struct buf b;

		buf_init(&b, BODY_CAP * 2);
		buf_puts(&b, "[{\"type\":\"message\",\"role\":\"user\",\"content\":"
		    "[{\"type\":\"input_text\",\"text\":");
		buf_json_str(&b, json_string_value(in), json_string_length(in));
		buf_puts(&b, "}]}]");
		if (b.err)
			buf_free(&b);
		r->items = b.data;
		r->items_len = b.len;
	} else if (json_is_array(in)) {
		r->items = json_dumps(in, JSON_COMPACT);
		r->items_len = r->items ? strlen(r->items) : 0;
		if (json_array_size(in) > 0) {
			r->first_id = item_id_json(json_array_get(in, 0));
			r->last_id = item_id_json(json_array_get(in, json_array_size(in) - 1));
		}
	}
}

static void
req_inspect_body(struct conn *c, const char *path, size_t plen)
{
	struct stub *ctx = c->ctx;
	struct req *r = &c->req;
	json_t *root, *so;
	const char *pre = NULL;
	size_t prelen = 0;
	int chat = r->route == ROUTE_CHAT || r->route == ROUTE_COMPLETIONS;

	ctx->last_body.len = 0;
	ctx->last_body.err = 0;
	buf_append(&ctx->last_body, r->body.data, r->body.len);
	if (plen >= sizeof ctx->last_path)
		plen = sizeof ctx->last_path - 1;
	memcpy(ctx->last_path, path, plen);
	ctx->last_path[plen] = '\0';

	if (r->body.len == 0 || (root = json_loadb(r->body.data, r->body.len, 0, NULL)) == NULL)
		return;
	so = json_is_object(root) ? json_object_get(root, "stream_options") : NULL;
	r->include_usage = chat && json_is_object(so) &&
	    lax_bool(json_object_get(so, "include_usage")) == 1;
	r->stream_lax = json_is_object(root) && lax_bool(json_object_get(root, "stream")) == 1;
	if (json_is_object(root) && !chat)
		api_inspect(c, root, &pre, &prelen);
	if (json_is_object(root) && r->route != ROUTE_COUNT_TOKENS)
		req_prompt(ctx, r, root, pre, prelen);
	json_decref(root);
	if (r->include_usage) {
		ctx->st.include_usage_requests++;
		if (r->tag != NULL)
			r->tag->include_usage_requests++;
	}
}

/* A complete request: decide what to answer and whether to wait first. */
static void
conn_dispatch(struct conn *c)
{
	struct req *r = &c->req;
	const char *url = r->arena.data ? r->arena.data : "";
	const char *q = memchr(url, '?', r->url_len);
	size_t plen = q ? (size_t)(q - url) : r->url_len;
	const char *tag;
	size_t tlen;

	r->dispatched = 1;
	r->route = route_of(r, url, plen);
	if (r->route == ROUTE_NOT_FOUND)
		r->route = route_stored(r, url, plen);
	r->api = r->route;
	if (plen < 4 || memcmp(url, "/v1/", 4) != 0) {
		/* Control, health and unknown paths: not counted, not steered. */
		if (r->route == ROUTE_HEALTH)
			c->ctx->st.health_requests++;
		conn_set_state(c, CONN_RESPOND);
		return;
	}

	tag = req_header(r, "X-Stub-Tag", &tlen);
	if (tag == NULL || tlen == 0) {
		tag = "-";
		tlen = 1;
	}
	if (tlen > TAG_MAX_LEN) {
		snprintf(r->errmsg, sizeof r->errmsg, "bad X-Stub-Tag: longer than %d bytes",
		    TAG_MAX_LEN);
		r->route = ROUTE_KNOB_ERROR;
	} else if ((r->tag = tag_get(c->ctx, tag, tlen)) == NULL) {
		snprintf(r->errmsg, sizeof r->errmsg, "too many tags (max %d); POST /stub/reset",
		    MAX_TAGS);
		r->route = ROUTE_KNOB_ERROR;
	}
	req_count(c);
	if (route_completion(r->route) || r->route == ROUTE_COUNT_TOKENS) {
		r->store = r->route == ROUTE_RESPONSES;	/* unless the body says false */
		req_inspect_body(c, url, plen);
	}
	if (r->route == ROUTE_KNOB_ERROR || req_parse_knobs(r) < 0) {
		r->route = ROUTE_KNOB_ERROR;
		conn_set_state(c, CONN_RESPOND);
		return;
	}
	if (route_completion(r->route) || r->route == ROUTE_COUNT_TOKENS) {
		r->stream = r->route != ROUTE_EMBEDDINGS && r->route != ROUTE_COUNT_TOKENS &&
		    (r->stream_lax || (r->body.len > 0 &&
		    (memmem(r->body.data, r->body.len, "\"stream\": true", 14) != NULL ||
		    memmem(r->body.data, r->body.len, "\"stream\":true", 13) != NULL)));
		if (r->k.status == 0 && r->k.events > NONSTREAM_MAX_EVENTS &&
		    (r->route == ROUTE_RESPONSES || (!r->stream &&
		    r->route != ROUTE_EMBEDDINGS && r->route != ROUTE_COUNT_TOKENS))) {
			snprintf(r->errmsg, sizeof r->errmsg, r->route == ROUTE_RESPONSES ?
			    "bad X-Stub-Events: want 0..%lld on /v1/responses" :
			    "bad X-Stub-Events: want 0..%lld for a non-stream response",
			    NONSTREAM_MAX_EVENTS);
			r->route = ROUTE_KNOB_ERROR;
			conn_set_state(c, CONN_RESPOND);
			return;
		}
		r->prompt_tokens = r->k.prompt_tokens >= 0 ? r->k.prompt_tokens :
		    (long long)((r->body.len + 3) / 4);
		r->completion_tokens = r->k.completion_tokens >= 0 ? r->k.completion_tokens :
		    r->k.events;
		r->send_usage = r->stream && r->include_usage && !r->k.ignore_usage;
	}
	if (route_completion(r->route)) {
		/* A loading or busy replica refuses the work at once; other knobs wait. */
		if (stub_loading(c->ctx)) {
			c->ctx->st.loading_rejected++;
			r->route = ROUTE_LOADING;
		} else if (c->ctx->busy) {
			c->ctx->st.busy_rejected++;
			r->route = ROUTE_BUSY;
		}
		if (r->route == ROUTE_LOADING || r->route == ROUTE_BUSY) {
			conn_set_state(c, CONN_RESPOND);
			return;
		}
	}
	if (!route_completion(r->route) || r->k.status != 0) {
		conn_serve(c);
		return;
	}
	if (r->route == ROUTE_RESPONSES && r->prev_id != NULL) {
		/* vLLM looks the previous response up before it schedules anything. */
		if (r->prev_found)
			c->ctx->st.previous_found++;
		else {
			c->ctx->st.previous_missing++;
			r->route = ROUTE_RESP_MISSING;
			conn_serve(c);
			return;
		}
	}
	if (r->route == ROUTE_EMBEDDINGS && r->emb == NULL) {
		r->route = ROUTE_BAD_INPUT;
		conn_serve(c);
		return;
	}
	runner_admit(c);
}

/* Build the first unit of the response into out. */
static void
conn_respond(struct conn *c)
{
	struct req *r = &c->req;
	char msg[64];

	c->events_sent = 0;
	c->usage_sent = 0;
	c->trailer_sent = 0;
	c->units = 0;
	c->unit_token = 0;
	switch (r->route) {
	case ROUTE_BAD:
		resp_error(c, r->err_status, r->errmsg);
		break;
	case ROUTE_KNOB_ERROR:
		resp_error(c, 400, r->errmsg);
		break;
	case ROUTE_CHAT:
	case ROUTE_COMPLETIONS:
	case ROUTE_RESPONSES:
	case ROUTE_MESSAGES:
	case ROUTE_EMBEDDINGS:
		if ((r->route == ROUTE_RESPONSES || r->route == ROUTE_MESSAGES) &&
		    r->k.status == 0)
			r->id_n = ++c->ctx->id_seq;
		if (r->k.status != 0) {
			snprintf(msg, sizeof msg, "stub status %lld", r->k.status);
			resp_stub_error(c, (int)r->k.status, msg);
		} else if (r->route == ROUTE_EMBEDDINGS)
			resp_embeddings(c);
		else if (r->stream)
			resp_stream_head(c);
		else if (r->route == ROUTE_RESPONSES)
			resp_responses_json(c);
		else if (r->route == ROUTE_MESSAGES)
			resp_messages_json(c);
		else
			resp_completion(c);
		break;
	case ROUTE_COUNT_TOKENS:
		resp_json_begin(c);
		buf_printf(&c->out, "{\"input_tokens\":%lld}", r->prompt_tokens);
		resp_json_end(c, 200);
		break;
	case ROUTE_RESP_GET:
	case ROUTE_RESP_DELETE:
	case ROUTE_RESP_CANCEL:
	case ROUTE_RESP_ITEMS:
		resp_stored(c);
		break;
	case ROUTE_RESP_MISSING:
		resp_not_stored(c, r->prev_id, r->prev_len);
		break;
	case ROUTE_BAD_INPUT:
		resp_error(c, 400, "bad input: want a string, a token array, or an array of "
		    "strings or token arrays");
		break;
	case ROUTE_ECHO:
		resp_echo(c);
		break;
	case ROUTE_MODELS:
		resp_models(c);
		break;
	case ROUTE_STATS:
		resp_stats(c);
		break;
	case ROUTE_RESET:
		stats_reset(c->ctx);
		resp_json_begin(c);
		buf_puts(&c->out, "{\"ok\":true}");
		resp_json_end(c, 200);
		break;
	case ROUTE_LAST:
		resp_last(c);
		break;
	case ROUTE_PREFILLS:
		resp_prefills(c);
		break;
	case ROUTE_HEALTH:
		resp_health(c);
		break;
	case ROUTE_METRICS:
		resp_metrics(c);
		break;
	case ROUTE_CTL_HEALTH:
	case ROUTE_CTL_BUSY:
	case ROUTE_CTL_SLOW_START:
		if (ctl_apply(c) < 0)
			resp_error(c, 400, r->errmsg);
		else
			resp_mode(c);
		break;
	case ROUTE_BUSY:
		resp_busy(c);
		break;
	case ROUTE_LOADING:
		resp_loading(c);
		break;
	case ROUTE_NOT_FOUND:
		resp_error(c, 404, "not found");
		break;
	}
	if (c->out.err) {
		stub_log(c->ctx, "out of memory building a response; closing");
		conn_set_closing(c, OUT_CUT);
		return;
	}
	conn_set_state(c, CONN_WRITE);
}

/*
 * Call in the same step that flushed out. Completion and cuts are decided here,
 * not a step later: a yield in between would let a client that read everything
 * and closed be counted as aborted_by_client.
 */
static void
conn_after_write(struct conn *c)
{
	const struct knobs *k = &c->req.k;

	switch (c->kind) {
	case RESP_CONTINUE:
		c->kind = RESP_NONE;
		conn_set_state(c, CONN_READ);
		return;
	case RESP_NONE:
	case RESP_FIXED:
		req_finish(c, OUT_COMPLETED);
		conn_set_state(c, CONN_DONE);
		return;
	case RESP_CUT_AFTER_HEAD:
		conn_set_closing(c, OUT_CUT);
		return;
	case RESP_STREAM:
		break;
	}
	if (c->trailer_sent) {
		c->ctx->st.streams_completed++;
		req_finish(c, OUT_COMPLETED);
		conn_set_state(c, CONN_DONE);
	} else if (c->req.route == ROUTE_RESPONSES || c->req.route == ROUTE_MESSAGES) {
		/* Abort-After counts the token events only; 0 cuts right after the head. */
		if (k->abort_after >= 0 && (c->units == 0 ? k->abort_after == 0 :
		    c->unit_token && c->events_sent == k->abort_after))
			conn_set_closing(c, OUT_CUT);
		else if (c->unit_token && c->events_sent < k->events && k->interval_ms > 0) {
			conn_arm_timer(c, (double)k->interval_ms * c->ctx->interval_scale / 1000.0);
			conn_set_state(c, CONN_PACE);
		} else
			conn_set_state(c, CONN_EMIT);
	} else if (k->abort_after >= 0 && c->events_sent + c->usage_sent == k->abort_after)
		conn_set_closing(c, OUT_CUT);
	else if (c->events_sent == 0 || c->events_sent >= k->events || k->interval_ms == 0)
		conn_set_state(c, CONN_EMIT);
	else {
		conn_arm_timer(c, (double)k->interval_ms * c->ctx->interval_scale / 1000.0);
		conn_set_state(c, CONN_PACE);
	}
}

/* The response is written and accounted: read the next request or close. */
static void
conn_done(struct conn *c)
{
	if (!c->req.keep_alive) {
		conn_set_closing(c, OUT_COMPLETED);
		return;
	}
	c->kind = RESP_NONE;
	if (c->out.cap > OUT_KEEP)
		buf_free(&c->out);
	req_reset(&c->req);
	http_parser_pause(&c->parser, 0);
	if (c->rio_stopped) {
		c->rio_stopped = 0;
		ev_io_start(c->ctx->loop, &c->rio);
	}
	conn_set_state(c, CONN_READ);
}

static void
conn_free(struct conn *c)
{
	struct stub *ctx = c->ctx;

	req_finish(c, c->close_outcome);
	ev_io_stop(ctx->loop, &c->rio);
	ev_io_stop(ctx->loop, &c->wio);
	ev_timer_stop(ctx->loop, &c->timer);
	close(c->fd);
	buf_free(&c->in);
	buf_free(&c->out);
	buf_free(&c->req.arena);
	buf_free(&c->req.body);
	free(c->req.blocks);
	req_free_api(&c->req);
	LIST_REMOVE(c, entry);
	ctx->st.connections_open--;
	free(c);
}

/*
 * Run the connection until it has to wait for the socket or a timer. Callers must
 * not touch c afterwards: it may have been freed.
 */
static void
conn_drive(struct conn *c)
{
	int budget = DRIVE_BUDGET;

	for (;;) {
		switch (c->state) {
		case CONN_CLOSING:
			conn_free(c);
			return;
		case CONN_QUEUED:
		case CONN_PREFILL:
		case CONN_DELAY:
		case CONN_HANG:
		case CONN_PACE:
			/* Waiting; the yield below must not replace a delay or pace timer. */
			return;
		default:
			break;
		}
		if (budget-- == 0) {
			conn_arm_timer(c, 0.);
			return;
		}
		switch (c->state) {
		case CONN_READ:
			switch (conn_read_request(c)) {
			case RD_WAIT:
				return;
			case RD_REQUEST:
				conn_set_state(c, CONN_DISPATCH);
				break;
			case RD_CONTINUE:
				c->out.len = 0;
				c->out.err = 0;
				c->out_pos = 0;
				buf_puts(&c->out, "HTTP/1.1 100 Continue\r\n\r\n");
				c->kind = RESP_CONTINUE;
				conn_set_state(c, c->out.err ? CONN_CLOSING : CONN_WRITE);
				break;
			case RD_BAD:
				c->req.route = ROUTE_BAD;
				c->req.dispatched = 1;
				c->req.keep_alive = 0;
				conn_set_state(c, CONN_RESPOND);
				break;
			case RD_EOF:
				conn_set_closing(c, OUT_COMPLETED);
				break;
			}
			break;
		case CONN_DISPATCH:
			conn_dispatch(c);
			break;
		case CONN_RESPOND:
			conn_respond(c);
			break;
		case CONN_WRITE:
			switch (conn_flush(c)) {
			case WR_DONE:
				conn_after_write(c);
				break;
			case WR_BLOCKED:
				return;
			case WR_GONE:
				conn_set_closing(c, OUT_ABORTED_BY_CLIENT);
				break;
			}
			break;
		case CONN_EMIT:
			if (c->req.route == ROUTE_RESPONSES || c->req.route == ROUTE_MESSAGES)
				api_stream_next(c);
			else if (c->events_sent < c->req.k.events)
				resp_stream_event(c);
			else if (c->req.send_usage && !c->usage_sent)
				resp_stream_usage(c);
			else
				resp_stream_trailer(c);
			if (c->out.err)
				conn_set_closing(c, OUT_CUT);
			else
				conn_set_state(c, CONN_WRITE);
			break;
		case CONN_DONE:
			conn_done(c);
			break;
		case CONN_QUEUED:
		case CONN_PREFILL:
		case CONN_DELAY:
		case CONN_HANG:
		case CONN_PACE:
		case CONN_CLOSING:
			break;	/* handled above */
		}
	}
}

/* ------------------------------------------------------------------ libev callbacks */

static void
conn_read_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	struct conn *c = w->data;

	if (c->state == CONN_READ) {
		conn_drive(c);
		return;
	}
	/* Mid-response the machine is waiting on a timer or EV_WRITE: only a close wakes it. */
	conn_watch_peer(c);
	if (c->state == CONN_CLOSING)
		conn_drive(c);
}

static void
conn_write_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	ev_io_stop(loop, w);
	conn_drive(w->data);
}

static void
conn_timer_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct conn *c = w->data;

	if (c->state == CONN_DELAY)
		conn_set_state(c, CONN_RESPOND);
	else if (c->state == CONN_PREFILL)
		runner_prefilled(c);
	else if (c->state == CONN_PACE)
		conn_set_state(c, CONN_EMIT);
	/* Otherwise it was a yield: the state already says what to do. */
	conn_drive(c);
}

static void
conn_new(struct stub *ctx, int fd)
{
	struct conn *c;
	int one = 1;

	if ((c = calloc(1, sizeof *c)) == NULL) {
		stub_log(ctx, "out of memory; dropping a connection");
		close(fd);
		return;
	}
	/* Events are small and due now; Nagle would hold them for the peer's ACK. */
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	c->ctx = ctx;
	c->fd = fd;
	buf_init(&c->in, IN_CAP);
	buf_init(&c->out, OUT_CAP);
	buf_init(&c->req.arena, ARENA_CAP);
	buf_init(&c->req.body, BODY_CAP);
	buf_init(&c->req.context, RS_CTX_CAP);
	req_reset(&c->req);
	http_parser_init(&c->parser, HTTP_REQUEST);
	c->parser.data = c;
	ev_io_init(&c->rio, conn_read_cb, fd, EV_READ);
	ev_io_init(&c->wio, conn_write_cb, fd, EV_WRITE);
	ev_init(&c->timer, conn_timer_cb);
	c->rio.data = c->wio.data = c->timer.data = c;
	c->state = CONN_READ;
	LIST_INSERT_HEAD(&ctx->conns, c, entry);
	ctx->st.connections_open++;
	ctx->st.connections_total++;
	ev_io_start(ctx->loop, &c->rio);
}

static void
accept_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	struct stub *ctx = w->data;
	int fd, i;

	for (i = 0; i < ACCEPTS_PER_PASS; i++) {
		fd = accept4(ctx->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd >= 0) {
			conn_new(ctx, fd);
			continue;
		}
		if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO)
			continue;
		if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
			/* Level-triggered accept would spin; try again in a moment. */
			stub_log(ctx, "accept: %s; pausing accepts for 100 ms", strerror(errno));
			ev_io_stop(loop, &ctx->accept_w);
			ev_timer_set(&ctx->accept_retry, 0.1, 0.);
			ev_timer_start(loop, &ctx->accept_retry);
		}
		return;
	}
}

static void
accept_retry_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct stub *ctx = w->data;

	ev_io_start(loop, &ctx->accept_w);
}

static void
signal_cb(struct ev_loop *loop, ev_signal *w, int revents)
{
	ev_break(loop, EVBREAK_ALL);
}

/* ------------------------------------------------------------------ startup */

/* Split "HOST:PORT" or "[V6]:PORT"; -1 on a malformed address. */
static int
split_listen(const char *arg, char *host, size_t hostsz, char *port, size_t portsz)
{
	const char *colon, *h = arg;
	size_t hl;

	if (*arg == '[') {
		const char *rb = strchr(arg, ']');

		if (rb == NULL || rb[1] != ':')
			return -1;
		h = arg + 1;
		hl = (size_t)(rb - h);
		colon = rb + 1;
	} else {
		if ((colon = strrchr(arg, ':')) == NULL)
			return -1;
		hl = (size_t)(colon - arg);
		if (memchr(arg, ':', hl) != NULL)	/* bare IPv6 needs brackets */
			return -1;
	}
	if (hl == 0 || hl >= hostsz || strlen(colon + 1) == 0 || strlen(colon + 1) >= portsz)
		return -1;
	if (strspn(colon + 1, "0123456789") != strlen(colon + 1) || atol(colon + 1) > 65535)
		return -1;
	memcpy(host, h, hl);
	host[hl] = '\0';
	strcpy(port, colon + 1);
	return 0;
}

/* Bind and listen; fatal on failure. Prints the one line tests wait for. */
static int
listen_on(const char *arg, unsigned *port_out)
{
	struct addrinfo hints, *res, *ai;
	struct sockaddr_storage ss;
	socklen_t slen = sizeof ss;
	char host[256], port[8], addr[INET6_ADDRSTRLEN];
	int fd = -1, one = 1, err;

	if (split_listen(arg, host, sizeof host, port, sizeof port) < 0)
		die("bad listen address '%s': want HOST:PORT or [V6]:PORT", arg);
	memset(&hints, 0, sizeof hints);
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
	if ((err = getaddrinfo(host, port, &hints, &res)) != 0)
		die("%s: %s", arg, gai_strerror(err));
	for (ai = res; ai != NULL; ai = ai->ai_next) {
		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
		    ai->ai_protocol);
		if (fd < 0)
			continue;
		(void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, LISTEN_BACKLOG) == 0)
			break;
		err = errno;
		close(fd);
		fd = -1;
		errno = err;
	}
	freeaddrinfo(res);
	if (fd < 0)
		die("listen on %s: %s", arg, strerror(errno));
	if (getsockname(fd, (struct sockaddr *)&ss, &slen) < 0)
		die("getsockname: %s", strerror(errno));
	if (ss.ss_family == AF_INET6) {
		struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;

		inet_ntop(AF_INET6, &s6->sin6_addr, addr, sizeof addr);
		printf("sluice-stub listening on [%s]:%u\n", addr, ntohs(s6->sin6_port));
		*port_out = ntohs(s6->sin6_port);
	} else {
		struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;

		inet_ntop(AF_INET, &s4->sin_addr, addr, sizeof addr);
		printf("sluice-stub listening on %s:%u\n", addr, ntohs(s4->sin_port));
		*port_out = ntohs(s4->sin_port);
	}
	fflush(stdout);
	return fd;
}

/* Thousands of connections need more than the usual 1024 descriptors. */
static void
raise_nofile(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		(void)setrlimit(RLIMIT_NOFILE, &rl);
	}
}

static void
usage(void)
{
	fprintf(stderr, "usage: sluice-stub [-l HOST:PORT] [-q] [--health-status CODE]\n"
	    "           [--slow-start SECONDS] [--busy] [--busy-status 429|503]\n"
	    "           [--busy-retry-after SECONDS] [--interval-scale F] [--batch N]\n"
	    "           [--prefix-cache BLOCKS] [--block BYTES] [--ttft-base-ms MS]\n"
	    "           [--ttft-ms-per-kib MS] [--prefill-mode independent|shared]\n"
	    "  -l  listen address (default " STUB_DEFAULT_LISTEN "; [::1]:PORT for IPv6)\n"
	    "  -q  no per-request logging\n"
	    "  --health-status CODE       GET /health answers CODE (200..599, not 204/304;"
	    " default 200)\n"
	    "  --slow-start SECONDS       loading for SECONDS after start: /health and"
	    " completions 503\n"
	    "  --busy                     completions answer 503 with Retry-After\n"
	    "  --busy-status 429|503      the status of a busy refusal (default 503)\n"
	    "  --busy-retry-after SECONDS Retry-After of a busy refusal (0..86400,"
	    " default 2)\n"
	    "  --interval-scale F         pause between events = X-Stub-Interval-Ms x F\n"
	    "                             (0 < F <= 1000, default 1)\n"
	    "  A model runner (all off by default):\n"
	    "  --batch N                  at most N completions at once, the rest wait in\n"
	    "                             a FIFO (0..100000, default 0: no limit)\n"
	    "  --prefix-cache BLOCKS      LRU of prompt block hashes (0..4194304, default 0)\n"
	    "  --block BYTES              prompt bytes per block (16..65536, default 64)\n"
	    "  --ttft-base-ms MS          prefill = base + per-KiB x uncached prompt KiB\n"
	    "  --ttft-ms-per-kib MS       (each 0..86400, fraction allowed, default 0)\n"
	    "  --prefill-mode M           independent (default): prefills run in parallel;\n"
	    "                             shared: their per-KiB compute is one FIFO lane\n");
	exit(2);
}

/* A whole decimal option value in [min, max], or usage. */
static long long
opt_ll(const char *name, const char *arg, long long min, long long max)
{
	long long v;

	if (parse_ll(arg, strlen(arg), &v) < 0 || v < min || v > max) {
		fprintf(stderr, "sluice-stub: bad %s '%s': want %lld..%lld\n", name, arg,
		    min, max);
		usage();
	}
	return v;
}

int
main(int argc, char **argv)
{
	static struct stub ctx;	/* large (scratch buffer): not on the stack */
	enum { OPT_HEALTH_STATUS = 256, OPT_SLOW_START, OPT_BUSY, OPT_BUSY_STATUS,
	    OPT_BUSY_RETRY_AFTER, OPT_INTERVAL_SCALE, OPT_BATCH, OPT_PREFIX_CACHE, OPT_BLOCK,
	    OPT_TTFT_BASE_MS, OPT_TTFT_MS_PER_KIB, OPT_PREFILL_MODE };
	static const struct option longopts[] = {
		{ "health-status",	required_argument, NULL, OPT_HEALTH_STATUS },
		{ "slow-start",		required_argument, NULL, OPT_SLOW_START },
		{ "busy",		no_argument,	   NULL, OPT_BUSY },
		{ "busy-status",	required_argument, NULL, OPT_BUSY_STATUS },
		{ "busy-retry-after",	required_argument, NULL, OPT_BUSY_RETRY_AFTER },
		{ "interval-scale",	required_argument, NULL, OPT_INTERVAL_SCALE },
		{ "batch",		required_argument, NULL, OPT_BATCH },
		{ "prefix-cache",	required_argument, NULL, OPT_PREFIX_CACHE },
		{ "block",		required_argument, NULL, OPT_BLOCK },
		{ "ttft-base-ms",	required_argument, NULL, OPT_TTFT_BASE_MS },
		{ "ttft-ms-per-kib",	required_argument, NULL, OPT_TTFT_MS_PER_KIB },
		{ "prefill-mode",	required_argument, NULL, OPT_PREFILL_MODE },
		{ NULL, 0, NULL, 0 }
	};
	const char *listen_arg = STUB_DEFAULT_LISTEN;
	double slow_start = 0;
	long long pc_blocks = 0;
	struct conn *c;
	int ch;

	ctx.health_status = 200;
	ctx.busy_status = 503;
	ctx.busy_retry_after = 2;
	ctx.interval_scale = 1.0;
	ctx.block = BLOCK_DEFAULT;
	while ((ch = getopt_long(argc, argv, "l:qh", longopts, NULL)) != -1) {
		switch (ch) {
		case 'l':
			listen_arg = optarg;
			break;
		case 'q':
			ctx.quiet = 1;
			break;
		case OPT_HEALTH_STATUS:
			ctx.health_status = (int)opt_ll("--health-status", optarg, 200, 599);
			if (!health_status_ok(ctx.health_status)) {
				fprintf(stderr, "sluice-stub: bad --health-status '%s': "
				    "204 and 304 carry no body\n", optarg);
				usage();
			}
			break;
		case OPT_SLOW_START:
			if (parse_secs(optarg, strlen(optarg), &slow_start) < 0) {
				fprintf(stderr, "sluice-stub: bad --slow-start '%s': want "
				    "0..%lld seconds (fraction allowed)\n", optarg, SECS_MAX);
				usage();
			}
			break;
		case OPT_BUSY:
			ctx.busy = 1;
			break;
		case OPT_BUSY_STATUS:
			ctx.busy_status = (int)opt_ll("--busy-status", optarg, 429, 503);
			if (ctx.busy_status != 429 && ctx.busy_status != 503) {
				fprintf(stderr, "sluice-stub: bad --busy-status '%s': "
				    "want 429 or 503\n", optarg);
				usage();
			}
			break;
		case OPT_BUSY_RETRY_AFTER:
			ctx.busy_retry_after = opt_ll("--busy-retry-after", optarg, 0, SECS_MAX);
			break;
		case OPT_INTERVAL_SCALE:
			if (parse_secs(optarg, strlen(optarg), &ctx.interval_scale) < 0 ||
			    ctx.interval_scale <= 0 || ctx.interval_scale > 1000) {
				fprintf(stderr, "sluice-stub: bad --interval-scale '%s': want "
				    "a decimal in (0, 1000]\n", optarg);
				usage();
			}
			break;
		case OPT_BATCH:
			ctx.batch = opt_ll("--batch", optarg, 0, BATCH_MAX);
			break;
		case OPT_PREFIX_CACHE:
			pc_blocks = opt_ll("--prefix-cache", optarg, 0, PC_MAX_BLOCKS);
			break;
		case OPT_BLOCK:
			ctx.block = (size_t)opt_ll("--block", optarg, BLOCK_MIN, BLOCK_MAX);
			break;
		case OPT_TTFT_BASE_MS:
		case OPT_TTFT_MS_PER_KIB:
			if (parse_secs(optarg, strlen(optarg), ch == OPT_TTFT_BASE_MS ?
			    &ctx.ttft_base_ms : &ctx.ttft_ms_per_kib) < 0) {
				fprintf(stderr, "sluice-stub: bad --%s '%s': want 0..%lld ms "
				    "(fraction allowed)\n", ch == OPT_TTFT_BASE_MS ?
				    "ttft-base-ms" : "ttft-ms-per-kib", optarg, SECS_MAX);
				usage();
			}
			break;
		case OPT_PREFILL_MODE:
			if (strcmp(optarg, "shared") == 0)
				ctx.prefill_shared = 1;
			else if (strcmp(optarg, "independent") == 0)
				ctx.prefill_shared = 0;
			else {
				fprintf(stderr, "sluice-stub: bad --prefill-mode '%s': want "
				    "independent or shared\n", optarg);
				usage();
			}
			break;
		default:
			usage();
		}
	}
	if (optind != argc)
		usage();

	/* A peer that resets mid-write must be an error return, not a death. */
	signal(SIGPIPE, SIG_IGN);
	raise_nofile();
	LIST_INIT(&ctx.conns);
	TAILQ_INIT(&ctx.tags);
	TAILQ_INIT(&ctx.waitq);
	TAILQ_INIT(&ctx.laneq);
	TAILQ_INIT(&ctx.rs_lru);
	pc_init(&ctx.pc, (uint32_t)pc_blocks);
	buf_init(&ctx.last_body, BODY_CAP);
	if ((ctx.loop = ev_default_loop(EVFLAG_AUTO)) == NULL)
		die("cannot initialise libev");
	ctx.lfd = listen_on(listen_arg, &ctx.port);
	/* The window starts when the listening line is out: a test times it from there. */
	stub_set_loading(&ctx, slow_start);

	ev_io_init(&ctx.accept_w, accept_cb, ctx.lfd, EV_READ);
	ctx.accept_w.data = &ctx;
	ev_io_start(ctx.loop, &ctx.accept_w);
	ev_prepare_init(&ctx.peak_w, peak_cb);
	ctx.peak_w.data = &ctx;
	ev_prepare_start(ctx.loop, &ctx.peak_w);
	ev_init(&ctx.accept_retry, accept_retry_cb);
	ctx.accept_retry.data = &ctx;
	ev_signal_init(&ctx.sigterm_w, signal_cb, SIGTERM);
	ev_signal_start(ctx.loop, &ctx.sigterm_w);
	ev_signal_init(&ctx.sigint_w, signal_cb, SIGINT);
	ev_signal_start(ctx.loop, &ctx.sigint_w);

	ev_run(ctx.loop, 0);

	ctx.stopping = 1;
	while ((c = LIST_FIRST(&ctx.conns)) != NULL) {
		c->close_outcome = OUT_SHUTDOWN;
		conn_free(c);
	}
	tags_free(&ctx);
	pc_free(&ctx.pc);
	rs_clear(&ctx);
	buf_free(&ctx.last_body);
	ev_io_stop(ctx.loop, &ctx.accept_w);
	ev_timer_stop(ctx.loop, &ctx.accept_retry);
	ev_signal_stop(ctx.loop, &ctx.sigterm_w);
	ev_signal_stop(ctx.loop, &ctx.sigint_w);
	close(ctx.lfd);
	ev_loop_destroy(ctx.loop);
	return 0;
}
