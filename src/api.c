/* SPDX-License-Identifier: BSD-2-Clause */
/* Which API a request speaks (sl_api.h). */
#include "config.h"

#include <http_parser.h>
#include <string.h>

#include "sl_api.h"
#include "sl_json.h"

const char *const sl_api_names[SL_API_COUNT] = {
	"other", "chat", "completions", "responses", "messages", "embeddings"
};

/*
 * Does the path p[0..len), percent-decoded, begin with lit? Returns the
 * bytes of p it took (> 0), or 0.
 */
static size_t
path_prefix(const char *p, size_t len, const char *lit)
{
	size_t i = 0;

	for (; *lit != '\0'; lit++) {
		unsigned char ch;

		if (i >= len)
			return 0;
		ch = (unsigned char)p[i++];
		if (ch == '%') {
			int hi, lo;

			if (len - i < 2 || (hi = sl_json_hexval(p[i])) < 0 ||
			    (lo = sl_json_hexval(p[i + 1])) < 0)
				return 0;
			ch = (unsigned char)(hi << 4 | lo);
			i += 2;
		}
		if (ch != (unsigned char)*lit)
			return 0;
	}
	return i;
}

/* Is p[0..len) a '/' (plain or %2f) followed by anything? */
static int
under(const char *p, size_t len)
{
	if (len >= 1 && p[0] == '/')
		return 1;
	return len >= 3 && p[0] == '%' && p[1] == '2' && (p[2] | 0x20) == 'f';
}

enum sl_api
sl_api_of(const char *url, size_t len, int *exact)
{
	static const struct {
		const char *path;
		enum sl_api api;
		int tree;          /* paths under it are the same API */
	} tab[] = {
		{ "/v1/chat/completions", SL_API_CHAT, 0 },
		{ "/v1/completions", SL_API_COMPLETIONS, 0 },
		{ "/v1/responses", SL_API_RESPONSES, 1 },
		{ "/v1/messages", SL_API_MESSAGES, 1 },
		{ "/v1/embeddings", SL_API_EMBEDDINGS, 0 },
	};
	const char *q = memchr(url, '?', len);
	size_t i, k;

	if (exact != NULL)
		*exact = 0;
	if (q != NULL)
		len = (size_t)(q - url);
	for (i = 0; i < sizeof(tab) / sizeof(tab[0]); i++) {
		if ((k = path_prefix(url, len, tab[i].path)) == 0)
			continue;
		if (k == len) {
			if (exact != NULL)
				*exact = 1;
			return tab[i].api;
		}
		if (tab[i].tree && under(url + k, len - k))
			return tab[i].api;
	}
	return SL_API_OTHER;
}

int
sl_api_metered(int method, const char *url, size_t len)
{
	int exact;
	enum sl_api a = sl_api_of(url, len, &exact);

	return method == HTTP_POST && exact && a != SL_API_OTHER;
}

const char *
sl_api_response_id(const char *url, size_t len, size_t *idlen)
{
	const char *q = memchr(url, '?', len), *id, *slash;
	size_t k, n;

	if (q != NULL)
		len = (size_t)(q - url);
	if ((k = path_prefix(url, len, "/v1/responses/")) == 0)
		return NULL;
	id = url + k;
	n = len - k;
	if ((slash = memchr(id, '/', n)) != NULL) {
		size_t rest = n - (size_t)(slash - id);

		if (!(rest == 7 && memcmp(slash, "/cancel", 7) == 0) &&
		    !(rest == 12 && memcmp(slash, "/input_items", 12) == 0))
			return NULL;
		n = (size_t)(slash - id);
	}
	if (n == 0 || n > 255 || memchr(id, '%', n) != NULL)
		return NULL;
	*idlen = n;
	return id;
}
