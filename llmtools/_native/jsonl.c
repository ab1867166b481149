/* JSON Lines text extraction for json2bin's fast path, loaded with ctypes (see __init__.py).
 *
 * llm_jsonl_extract() walks a buffer of whole JSONL lines and copies the value of one top-level string
 * key of every line, unescaped, as UTF-8, into one flat buffer with offsets: what
 * `[json.loads(line)[key].encode() for line in lines]` gives, without a Python object per line.
 *
 * It is deliberately conservative: it accepts only lines it can judge exactly like Python's json
 * module (RFC 8259 strict JSON, valid UTF-8, an object holding the key exactly once, as a string
 * without lone surrogate escapes, no escape inside any top-level key, nesting at most MAX_DEPTH).
 * Anything else -- a blank line, bad JSON, NaN, a missing key, invalid UTF-8, a duplicate key -- makes
 * it return -1, and the caller judges the whole chunk with the Python path instead, so the outcome
 * (texts, errors, messages) never depends on whether this code ran.
 */
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#if defined(_WIN32)
#define LLM_EXPORT __declspec(dllexport)
#else
#define LLM_EXPORT __attribute__((visibility("default")))
#endif

#define MAX_DEPTH 64
#define NOT_PLAIN (-1)

typedef struct {
    const uint8_t *p;   /* next byte */
    const uint8_t *end; /* end of the line (its '\n' excluded) */
} cursor;

static inline void skip_ws(cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\r' || *c->p == '\n')) c->p++;
}

/* Length of the valid UTF-8 sequence at p (2..4 bytes, lead byte >= 0x80), or 0 when invalid:
 * overlong forms, surrogates (U+D800..DFFF) and code points above U+10FFFF are invalid, as in
 * Python's decoder. */
static inline int utf8_sequence(const uint8_t *p, const uint8_t *end) {
    const uint8_t b0 = p[0];
    const int64_t left = end - p;
    if (b0 >= 0xC2 && b0 <= 0xDF) return (left >= 2 && (p[1] & 0xC0) == 0x80) ? 2 : 0;
    if (b0 >= 0xE0 && b0 <= 0xEF) {
        if (left < 3 || (p[2] & 0xC0) != 0x80) return 0;
        const uint8_t lo = b0 == 0xE0 ? 0xA0 : 0x80, hi = b0 == 0xED ? 0x9F : 0xBF;
        return (p[1] >= lo && p[1] <= hi) ? 3 : 0;
    }
    if (b0 >= 0xF0 && b0 <= 0xF4) {
        if (left < 4 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80) return 0;
        const uint8_t lo = b0 == 0xF0 ? 0x90 : 0x80, hi = b0 == 0xF4 ? 0x8F : 0xBF;
        return (p[1] >= lo && p[1] <= hi) ? 4 : 0;
    }
    return 0;
}

static inline int hex4(const uint8_t *p, uint32_t *value) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
        const uint8_t h = p[i];
        v <<= 4;
        if (h >= '0' && h <= '9') v |= (uint32_t)(h - '0');
        else if (h >= 'a' && h <= 'f') v |= (uint32_t)(h - 'a' + 10);
        else if (h >= 'A' && h <= 'F') v |= (uint32_t)(h - 'A' + 10);
        else return 0;
    }
    *value = v;
    return 1;
}

/* The end of the run of ordinary string bytes at p: printable ASCII other than '"' and '\\'. */
static inline const uint8_t *plain_run(const uint8_t *p, const uint8_t *end) {
#if defined(__SSE2__)
    /* 16 bytes at a time: as signed bytes, both control characters and bytes >= 0x80 are < 0x20 */
    const __m128i space = _mm_set1_epi8(0x20), quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\');
    while (end - p >= 16) {
        const __m128i v = _mm_loadu_si128((const __m128i *)p);
        const __m128i stop = _mm_or_si128(_mm_cmplt_epi8(v, space),
                                          _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)));
        const int mask = _mm_movemask_epi8(stop);
        if (mask) return p + __builtin_ctz((unsigned)mask);
        p += 16;
    }
#endif
    while (p < end && *p >= 0x20 && *p < 0x80 && *p != '"' && *p != '\\') p++;
    return p;
}

/* A string whose opening quote was consumed. With `out`, its value is written there as UTF-8 and
 * *written gets its length. A \u escape of a surrogate must be a high one followed by a low one;
 * a lone surrogate (which json.loads accepts, and no tokenizer can encode) is not plain.
 * *escaped tells whether the raw string held any backslash. Returns 0 when not plain. */
static int string_value(cursor *c, uint8_t *out, int64_t *written, int *escaped) {
    uint8_t *o = out;
    *escaped = 0;
    while (c->p < c->end) {
        /* the plain run up to the next quote, backslash, control or non-ASCII byte, copied at once */
        const uint8_t *run = c->p;
        c->p = plain_run(c->p, c->end);
        if (o && c->p > run) {
            memcpy(o, run, (size_t)(c->p - run));
            o += c->p - run;
        }
        if (c->p >= c->end) return 0;
        const uint8_t b = *c->p;
        if (b == '"') {
            c->p++;
            if (written) *written = o ? o - out : 0;
            return 1;
        }
        if (b < 0x20) return 0; /* a raw control character: json.loads (strict) refuses it */
        if (b >= 0x80) {
            const int n = utf8_sequence(c->p, c->end);
            if (!n) return 0;
            if (o) {
                memcpy(o, c->p, (size_t)n);
                o += n;
            }
            c->p += n;
            continue;
        }
        /* a backslash escape */
        *escaped = 1;
        if (c->end - c->p < 2) return 0;
        const uint8_t e = c->p[1];
        c->p += 2;
        uint8_t simple = 0;
        switch (e) {
        case '"': simple = '"'; break;
        case '\\': simple = '\\'; break;
        case '/': simple = '/'; break;
        case 'b': simple = '\b'; break;
        case 'f': simple = '\f'; break;
        case 'n': simple = '\n'; break;
        case 'r': simple = '\r'; break;
        case 't': simple = '\t'; break;
        case 'u': break;
        default: return 0;
        }
        if (e != 'u') {
            if (o) *o++ = simple;
            continue;
        }
        uint32_t cp;
        if (c->end - c->p < 4 || !hex4(c->p, &cp)) return 0;
        c->p += 4;
        if (cp >= 0xD800 && cp <= 0xDFFF) {
            uint32_t low;
            if (cp > 0xDBFF || c->end - c->p < 6 || c->p[0] != '\\' || c->p[1] != 'u' || !hex4(c->p + 2, &low) ||
                low < 0xDC00 || low > 0xDFFF)
                return 0; /* a lone surrogate */
            c->p += 6;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
        }
        if (!o) continue;
        if (cp < 0x80) {
            *o++ = (uint8_t)cp;
        } else if (cp < 0x800) {
            *o++ = (uint8_t)(0xC0 | (cp >> 6));
            *o++ = (uint8_t)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            *o++ = (uint8_t)(0xE0 | (cp >> 12));
            *o++ = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
            *o++ = (uint8_t)(0x80 | (cp & 0x3F));
        } else {
            *o++ = (uint8_t)(0xF0 | (cp >> 18));
            *o++ = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
            *o++ = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
            *o++ = (uint8_t)(0x80 | (cp & 0x3F));
        }
    }
    return 0;
}

/* -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? -- NaN and Infinity (which json.loads accepts) are
 * not plain, nor an integer part longer than MAX_INT_DIGITS (the Python parser refuses such an integer,
 * llmtools.formats.jsonfile.MAX_INT_DIGITS, and decides the line). */
#define MAX_INT_DIGITS 4300
static int number_value(cursor *c) {
    if (c->p < c->end && *c->p == '-') c->p++;
    if (c->p >= c->end) return 0;
    if (*c->p == '0') {
        c->p++;
    } else if (*c->p >= '1' && *c->p <= '9') {
        const uint8_t *first = c->p;
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') c->p++;
        if (c->p - first > MAX_INT_DIGITS) return 0;
    } else {
        return 0;
    }
    if (c->p < c->end && *c->p == '.') {
        c->p++;
        const uint8_t *digits = c->p;
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') c->p++;
        if (c->p == digits) return 0;
    }
    if (c->p < c->end && (*c->p == 'e' || *c->p == 'E')) {
        c->p++;
        if (c->p < c->end && (*c->p == '+' || *c->p == '-')) c->p++;
        const uint8_t *digits = c->p;
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') c->p++;
        if (c->p == digits) return 0;
    }
    return 1;
}

static int literal(cursor *c, const char *word, int64_t n) {
    if (c->end - c->p < n || memcmp(c->p, word, (size_t)n) != 0) return 0;
    c->p += n;
    return 1;
}

/* An object member's name (the cursor at its opening quote) and the ':' after it, checked and skipped. */
static int member_name(cursor *c) {
    int escaped;
    if (c->p >= c->end || *c->p != '"') return 0;
    c->p++;
    if (!string_value(c, NULL, NULL, &escaped)) return 0;
    skip_ws(c);
    if (c->p >= c->end || *c->p != ':') return 0;
    c->p++;
    return 1;
}

/* Any JSON value, checked and skipped (objects and arrays with an explicit stack, no recursion). */
static int skip_value(cursor *c) {
    uint8_t stack[MAX_DEPTH]; /* '{' or '[' for each open container */
    int depth = 0;
    int escaped;
    for (;;) {
        skip_ws(c);
        if (c->p >= c->end) return 0;
        /* one value */
        const uint8_t b = *c->p;
        if (b == '{' || b == '[') {
            if (depth == MAX_DEPTH) return 0;
            c->p++;
            skip_ws(c);
            if (c->p < c->end && *c->p == (b == '{' ? '}' : ']')) {
                c->p++; /* empty container: a complete value */
            } else {
                stack[depth++] = b;
                if (b == '{' && !member_name(c)) return 0; /* its first member */
                continue; /* the first element */
            }
        } else if (b == '"') {
            c->p++;
            if (!string_value(c, NULL, NULL, &escaped)) return 0;
        } else if (b == 't') {
            if (!literal(c, "true", 4)) return 0;
        } else if (b == 'f') {
            if (!literal(c, "false", 5)) return 0;
        } else if (b == 'n') {
            if (!literal(c, "null", 4)) return 0;
        } else if (!number_value(c)) {
            return 0;
        }
        /* after a value: close containers, or go on with the next element */
        for (;;) {
            if (depth == 0) return 1;
            skip_ws(c);
            if (c->p >= c->end) return 0;
            const uint8_t open = stack[depth - 1];
            if (*c->p == (open == '{' ? '}' : ']')) {
                c->p++;
                depth--;
                continue;
            }
            if (*c->p != ',') return 0;
            c->p++;
            if (open == '{') {
                skip_ws(c);
                if (!member_name(c)) return 0;
            }
            break;
        }
    }
}

/* One line: 1 and the key's text appended at *out (*written bytes), or 0 when not plain. */
static int extract_line(cursor *c, const uint8_t *key, int64_t key_len, uint8_t *out, int64_t *written) {
    int found = 0, escaped;
    skip_ws(c);
    if (c->p >= c->end || *c->p != '{') return 0;
    c->p++;
    skip_ws(c);
    if (c->p < c->end && *c->p == '}') return 0; /* {}: the key is missing */
    for (;;) {
        if (c->p >= c->end || *c->p != '"') return 0;
        c->p++;
        const uint8_t *name = c->p;
        if (!string_value(c, NULL, NULL, &escaped) || escaped) return 0;
        const int is_key = (c->p - 1 - name) == key_len && memcmp(name, key, (size_t)key_len) == 0;
        skip_ws(c);
        if (c->p >= c->end || *c->p != ':') return 0;
        c->p++;
        skip_ws(c);
        if (is_key) {
            /* a duplicate key: json.loads keeps the last one -- left to the Python path */
            if (found || c->p >= c->end || *c->p != '"') return 0;
            c->p++;
            if (!string_value(c, out, written, &escaped)) return 0;
            found = 1;
        } else if (!skip_value(c)) {
            return 0;
        }
        skip_ws(c);
        if (c->p < c->end && *c->p == ',') {
            c->p++;
            skip_ws(c);
            continue;
        }
        if (c->p < c->end && *c->p == '}') {
            c->p++;
            break;
        }
        return 0;
    }
    skip_ws(c);
    return found && c->p == c->end;
}

/* Extract `key` from every line of data[0:size] (whole lines; the last one may lack its '\n').
 *
 * `out` must hold `size` bytes (a value is never longer than its line), `offsets` max_lines + 1
 * entries. Returns the number of lines, with text i at out[offsets[i]:offsets[i+1]], or -1 when any
 * line is not plain (see the top of this file) or there are more than max_lines lines. */
LLM_EXPORT int64_t llm_jsonl_extract(const uint8_t *data, int64_t size, const uint8_t *key, int64_t key_len,
                                     uint8_t *out, int64_t *offsets, int64_t max_lines) {
    int64_t lines = 0, used = 0;
    const uint8_t *p = data, *end = data + size;
    offsets[0] = 0;
    while (p < end) {
        if (lines == max_lines) return NOT_PLAIN;
        const uint8_t *nl = memchr(p, '\n', (size_t)(end - p));
        const uint8_t *line_end = nl ? nl : end;
        cursor c = {p, line_end};
        int64_t written = 0;
        if (!extract_line(&c, key, key_len, out + used, &written)) return NOT_PLAIN;
        used += written;
        offsets[++lines] = used;
        p = nl ? nl + 1 : end;
    }
    return lines;
}

/* The number of '\n' bytes in data[0:size] (called without the GIL, unlike bytes.count). */
LLM_EXPORT int64_t llm_count_newlines(const uint8_t *data, int64_t size) {
    int64_t count = 0;
    const uint8_t *p = data, *end = data + size;
    while (p < end) {
        const uint8_t *nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl) break;
        count++;
        p = nl + 1;
    }
    return count;
}
