/* tokvocab.c: token texts of a byte_tokenizer.json or a byte-level BPE tokenizer.json, and
 * the terminal-safe printer; see tokvocab.h. Both loaders count first (the largest id, the
 * bytes of every text), then fill one offsets table and one byte blob. */
#include "io/tokvocab.h"

#include "util.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FROM_VOCAB 4u /* loader-only flag: the id came from model.vocab (a second one is an error) */

void tokvocab_free(tokvocab *v)
{
    if (!v)
        return;
    free(v->off);
    free(v->bytes);
    free(v->flags);
    memset(v, 0, sizeof *v);
}

/* GPT-2's table: the printable bytes ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) stand for
 * themselves; the other 68 bytes, in increasing order, for U+0100, U+0101, ... */
static int printable_byte(int b)
{
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

uint32_t tokvocab_byte_char(int b)
{
    if (printable_byte(b))
        return (uint32_t)b;
    uint32_t k = 0;
    for (int i = 0; i < b; i++)
        k += !printable_byte(i);
    return 256u + k;
}

/* The byte a code point of a byte-level vocabulary stands for, or -1. */
static int char_byte(uint32_t cp)
{
    static int16_t table[256 + 68];
    static int ready; /* filled once; every caller writes the same values, so a race is benign */
    if (!ready) {
        for (int i = 0; i < 256 + 68; i++)
            table[i] = -1;
        for (int b = 0; b < 256; b++)
            table[tokvocab_byte_char(b)] = (int16_t)b;
        ready = 1;
    }
    return cp < 256 + 68 ? table[cp] : -1;
}

/* One UTF-8 code point at s[0..n): its length (1..4) and *cp, or 0 when the bytes there
 * are not a valid, shortest-form encoding of a scalar value. */
static int utf8_next(const unsigned char *s, size_t n, uint32_t *cp)
{
    unsigned char c = s[0];
    int k;
    uint32_t v, min;
    if (c < 0x80) {
        *cp = c;
        return 1;
    } else if ((c & 0xE0) == 0xC0) {
        k = 2, v = c & 0x1Fu, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
        k = 3, v = c & 0x0Fu, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
        k = 4, v = c & 0x07u, min = 0x10000;
    } else {
        return 0;
    }
    if (n < (size_t)k)
        return 0;
    for (int i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        v = (v << 6) | (s[i] & 0x3Fu);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        return 0;
    *cp = v;
    return k;
}

size_t tokvocab_print(FILE *f, const unsigned char *buf, size_t len, int flags)
{
    size_t esc = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int k = utf8_next(buf + i, len - i, &cp);
        if ((flags & TOKVOCAB_ESC_LAYOUT) && k == 1 && (cp == '\n' || cp == '\t')) {
            fputs(cp == '\n' ? "\\n" : "\\t", f);
            i++;
        } else if (k == 0) {
            fprintf(f, "\\x%02x", buf[i]);
            esc++, i++;
        } else if ((cp < 0x20 && cp != '\n' && cp != '\t') || cp == 0x7F) {
            fprintf(f, "\\x%02x", (unsigned)cp);
            esc++, i++;
        } else if (cp >= 0x80 && cp < 0xA0) { /* C1 controls: CSI (U+009B) starts escape sequences too */
            fprintf(f, "\\u%04x", (unsigned)cp);
            esc++, i += (size_t)k;
        } else {
            fwrite(buf + i, 1, (size_t)k, f);
            i += (size_t)k;
        }
    }
    return esc;
}

int tokvocab_token(const tokvocab *v, uint32_t id, const unsigned char **text, size_t *len, int *special)
{
    if (!v || id >= (uint32_t)v->n || !(v->flags[id] & TOKVOCAB_PRESENT))
        return 0;
    *text = v->bytes + v->off[id];
    *len = v->off[id + 1] - v->off[id];
    if (special)
        *special = (v->flags[id] & TOKVOCAB_SPECIAL) != 0;
    return 1;
}

/* An id field: an integer in [0, TOKVOCAB_MAX_ID). */
static int get_id(const json_t *j, long long *out)
{
    if (!json_is_integer(j) || json_integer_value(j) < 0 || json_integer_value(j) >= TOKVOCAB_MAX_ID)
        return -1;
    *out = json_integer_value(j);
    return 0;
}

/* off[] from per-id lengths in off[0..n) (shifted into a prefix sum), then the blob. */
static int alloc_blob(tokvocab *v, char *err, size_t errlen)
{
    uint64_t total = 0;
    for (int i = 0; i < v->n; i++) {
        uint32_t l = v->off[i];
        v->off[i] = (uint32_t)total;
        total += l;
        if (total > UINT32_MAX)
            return df_err(err, errlen, -EINVAL, "%s: the token texts add up to more than 4 GiB", v->path);
    }
    v->off[v->n] = (uint32_t)total;
    v->bytes = malloc(total ? total : 1);
    return v->bytes ? 0 : -ENOMEM;
}

static int alloc_tables(tokvocab *v, int n)
{
    v->n = n;
    v->off = calloc((size_t)n + 1, sizeof *v->off);
    v->flags = calloc((size_t)n ? (size_t)n : 1, 1);
    return v->off && v->flags ? 0 : -ENOMEM;
}

/* byte_tokenizer.json (scripts/train_target.py writes it) */
static int load_bytes(tokvocab *v, json_t *root, char *err, size_t errlen)
{
    static const char *const names[] = {"bos", "eos", "user", "assistant", "pad", "mask"};
    enum { N_NAMES = sizeof names / sizeof names[0] };
    long long vs, ids[N_NAMES];
    json_t *jv = json_object_get(root, "vocab_size");
    if (get_id(jv, &vs) < 0 || vs < 256)
        return df_err(err, errlen, -EINVAL, "%s: vocab_size: expected an integer in [256, %d)", v->path,
                      TOKVOCAB_MAX_ID);
    for (int k = 0; k < N_NAMES; k++) {
        json_t *j = json_object_get(root, names[k]);
        ids[k] = -1;
        /* pad and mask are optional (prompts need only the other four) */
        if (!j && k >= 4)
            continue;
        if (get_id(j, &ids[k]) < 0 || ids[k] < 256 || ids[k] >= vs)
            return df_err(err, errlen, -EINVAL, "%s: %s: expected a token id in [256, %lld) (vocab_size)", v->path,
                          names[k], vs);
        /* one text per id: two names on one id would give the slot two lengths */
        for (int q = 0; q < k; q++)
            if (ids[q] == ids[k])
                return df_err(err, errlen, -EINVAL, "%s: %s and %s are the same token id %lld", v->path, names[q],
                              names[k], ids[k]);
    }
    int rc = alloc_tables(v, (int)vs);
    if (rc < 0)
        return rc;
    for (int b = 0; b < 256; b++) /* a byte is the latin-1 character of its value: 1 or 2 bytes of UTF-8 */
        v->off[b] = b < 0x80 ? 1 : 2;
    for (int k = 0; k < N_NAMES; k++)
        if (ids[k] >= 0)
            v->off[ids[k]] = (uint32_t)(strlen(names[k]) + 4); /* <|name|> */
    if ((rc = alloc_blob(v, err, errlen)) < 0)
        return rc;
    for (int b = 0; b < 256; b++) {
        unsigned char *p = v->bytes + v->off[b];
        if (b < 0x80) {
            p[0] = (unsigned char)b;
        } else {
            p[0] = (unsigned char)(0xC0 | (b >> 6));
            p[1] = (unsigned char)(0x80 | (b & 0x3F));
        }
        v->flags[b] = TOKVOCAB_PRESENT;
    }
    for (int k = 0; k < N_NAMES; k++) {
        if (ids[k] < 0)
            continue;
        char buf[32];
        snprintf(buf, sizeof buf, "<|%s|>", names[k]);
        memcpy(v->bytes + v->off[ids[k]], buf, strlen(buf));
        v->flags[ids[k]] = TOKVOCAB_PRESENT | TOKVOCAB_SPECIAL;
    }
    return 0;
}

/* The bytes a byte-level vocab key stands for, written to out (NULL: only counted): the
 * count, or -1 with err naming the key and the character. */
static long key_bytes(const tokvocab *v, const char *key, unsigned char *out, char *err, size_t errlen)
{
    const unsigned char *s = (const unsigned char *)key;
    size_t n = strlen(key), i = 0;
    long m = 0;
    while (i < n) {
        uint32_t cp = s[i];
        int k = utf8_next(s + i, n - i, &cp);
        int b = k ? char_byte(cp) : -1;
        if (b < 0) {
            df_err(err, errlen, -EINVAL,
                   "%s: model.vocab[\"%.40s\"]: U+%04X is not a byte-level character (only byte-level BPE "
                   "vocabularies, GPT-2 / Llama-3 / Qwen style, can be decoded)",
                   v->path, key, (unsigned)cp);
            return -1;
        }
        if (out)
            out[m] = (unsigned char)b;
        m++, i += (size_t)k;
    }
    return m;
}

/* tokenizer.json of a byte-level BPE */
static int load_bpe(tokvocab *v, json_t *root, char *err, size_t errlen)
{
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model))
        return df_err(err, errlen, -EINVAL, "%s: model: missing or not an object", v->path);
    const char *type = json_string_value(json_object_get(model, "type"));
    if (!type || strcmp(type, "BPE"))
        return df_err(err, errlen, -EINVAL,
                      "%s: model.type: \"%.40s\" is not \"BPE\" (only byte-level BPE can be decoded)", v->path,
                      type ? type : "(missing)");
    json_t *dec = json_object_get(root, "decoder");
    if (dec && !json_is_null(dec)) {
        const char *dt = json_string_value(json_object_get(dec, "type"));
        if (!dt || strcmp(dt, "ByteLevel"))
            return df_err(err, errlen, -EINVAL,
                          "%s: decoder.type: \"%.40s\" is not \"ByteLevel\" (only byte-level BPE can be decoded)",
                          v->path, dt ? dt : "(missing)");
    }
    json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab))
        return df_err(err, errlen, -EINVAL, "%s: model.vocab: missing or not an object", v->path);
    json_t *added = json_object_get(root, "added_tokens");
    if (added && !json_is_null(added) && !json_is_array(added))
        return df_err(err, errlen, -EINVAL, "%s: added_tokens: not a list", v->path);
    size_t n_added = json_is_array(added) ? json_array_size(added) : 0;

    /* pass 1: every id valid, the largest */
    long long max_id = -1, id;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val)
    {
        if (get_id(val, &id) < 0)
            return df_err(err, errlen, -EINVAL, "%s: model.vocab[\"%.40s\"]: expected a token id in [0, %d)", v->path,
                          key, TOKVOCAB_MAX_ID);
        max_id = id > max_id ? id : max_id;
    }
    for (size_t i = 0; i < n_added; i++) {
        json_t *t = json_array_get(added, i);
        if (!json_is_object(t) || get_id(json_object_get(t, "id"), &id) < 0 ||
            !json_is_string(json_object_get(t, "content")))
            return df_err(err, errlen, -EINVAL,
                          "%s: added_tokens[%zu]: expected an object with an id in [0, %d) and a content", v->path, i,
                          TOKVOCAB_MAX_ID);
        max_id = id > max_id ? id : max_id;
    }
    if (max_id < 0)
        return df_err(err, errlen, -EINVAL, "%s: model.vocab and added_tokens are empty", v->path);
    int rc = alloc_tables(v, (int)max_id + 1);
    if (rc < 0)
        return rc;
    /* pass 2: lengths (off[] holds them until alloc_blob); added tokens first, they win */
    for (size_t i = 0; i < n_added; i++) {
        json_t *t = json_array_get(added, i);
        get_id(json_object_get(t, "id"), &id);
        if (v->flags[id])
            return df_err(err, errlen, -EINVAL, "%s: added_tokens[%zu]: id %lld is added twice", v->path, i, id);
        v->flags[id] = TOKVOCAB_PRESENT | TOKVOCAB_SPECIAL;
        size_t l = json_string_length(json_object_get(t, "content"));
        if (l > UINT32_MAX)
            return df_err(err, errlen, -EINVAL, "%s: added_tokens[%zu]: content too long", v->path, i);
        v->off[id] = (uint32_t)l;
    }
    json_object_foreach(vocab, key, val)
    {
        get_id(val, &id);
        if (v->flags[id] & FROM_VOCAB)
            return df_err(err, errlen, -EINVAL, "%s: model.vocab[\"%.40s\"]: id %lld is given to another token too",
                          v->path, key, id);
        if (v->flags[id] & TOKVOCAB_SPECIAL) {
            v->flags[id] |= FROM_VOCAB;
            continue;
        }
        long m = key_bytes(v, key, NULL, err, errlen);
        if (m < 0)
            return -EINVAL;
        v->flags[id] = TOKVOCAB_PRESENT | FROM_VOCAB;
        v->off[id] = (uint32_t)m;
    }
    if ((rc = alloc_blob(v, err, errlen)) < 0)
        return rc;
    /* pass 3: the texts */
    for (size_t i = 0; i < n_added; i++) {
        json_t *t = json_array_get(added, i);
        get_id(json_object_get(t, "id"), &id);
        json_t *c = json_object_get(t, "content");
        memcpy(v->bytes + v->off[id], json_string_value(c), json_string_length(c));
    }
    json_object_foreach(vocab, key, val)
    {
        get_id(val, &id);
        if (!(v->flags[id] & TOKVOCAB_SPECIAL))
            key_bytes(v, key, v->bytes + v->off[id], NULL, 0);
    }
    for (int i = 0; i < v->n; i++)
        v->flags[i] &= (uint8_t)~FROM_VOCAB;
    return 0;
}

int tokvocab_parse(tokvocab *v, const char *json, size_t len, tokvocab_kind kind, const char *name, char *err,
                   size_t errlen)
{
    memset(v, 0, sizeof *v);
    snprintf(v->path, sizeof v->path, "%s", name);
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    int rc;
    if (!root) {
        rc = df_err(err, errlen, -EINVAL, "%s: line %d column %d: %s", v->path, je.line, je.column, je.text);
    } else if (!json_is_object(root)) {
        rc = df_err(err, errlen, -EINVAL, "%s: expected a JSON object", v->path);
    } else {
        v->kind = kind;
        rc = kind == TOKVOCAB_BYTES ? load_bytes(v, root, err, errlen) : load_bpe(v, root, err, errlen);
        if (rc == -ENOMEM)
            snprintf(err, errlen, "%s: out of memory", v->path);
    }
    json_decref(root);
    if (rc < 0)
        tokvocab_free(v);
    return rc;
}

int tokvocab_load(tokvocab *v, const char *dir, char *err, size_t errlen)
{
    memset(v, 0, sizeof *v);
    char path[sizeof v->path];
    tokvocab_kind kind = TOKVOCAB_BYTES;
    snprintf(path, sizeof path, "%s/byte_tokenizer.json", dir);
    if (access(path, F_OK) != 0) {
        kind = TOKVOCAB_BPE;
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
        if (access(path, F_OK) != 0) {
            return df_err(err, errlen, -ENOENT,
                          "%s: no byte_tokenizer.json and no tokenizer.json: not a tokenizer directory", dir);
        }
    }
    char *text = NULL;
    size_t len = 0;
    int rc = df_read_regular(path, &text, &len, err, errlen);
    if (rc < 0)
        return rc;
    rc = tokvocab_parse(v, text, len, kind, path, err, errlen);
    free(text);
    return rc;
}
