/* eval_prompts.c: prompts from shards and chat JSONL, see eval_prompts.h. */
#include "eval/eval_prompts.h"

#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/shard.h"
#include "util.h"

void prompts_free(prompts_list *l)
{
    if (!l)
        return;
    for (int i = 0; i < l->n; i++)
        free(l->p[i].tokens);
    free(l->p);
    memset(l, 0, sizeof *l);
}

/* Take ownership of toks[n] (keeping the last max_len), labelled source. */
static int add(prompts_list *l, int32_t *toks, int n, int max_len, const char *source)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        prompts_entry *p = realloc(l->p, sizeof(*p) * (size_t)cap);
        if (!p) {
            free(toks);
            return -ENOMEM;
        }
        l->p = p, l->cap = cap;
    }
    if (max_len > 0 && n > max_len) {
        memmove(toks, toks + (n - max_len), sizeof(int32_t) * (size_t)max_len);
        n = max_len;
    }
    prompts_entry *e = &l->p[l->n++];
    e->tokens = toks;
    e->n = n;
    snprintf(e->source, sizeof e->source, "%s", source);
    return 0;
}

static int load_shard(prompts_list *l, const char *path, int vocab, int max_total, int max_len, char *err,
                      size_t errlen)
{
    dataset *ds = NULL;
    char *paths[1] = {(char *)path};
    int rc = dataset_open(&ds, paths, 1, err, errlen);
    if (rc < 0)
        return rc;
    /* compared unsigned: a header vocab_size past 2^31 cast to int was negative and passed,
     * letting token ids past the target's table through as negative int32 */
    if (vocab <= 0 || dataset_vocab_size(ds) > (uint32_t)vocab) {
        rc = df_err(err, errlen, -EINVAL, "%s: header vocab_size %u exceeds the target's vocab_size %d", path,
                    dataset_vocab_size(ds), vocab);
        dataset_close(ds);
        return rc;
    }
    for (uint64_t i = 0; i < dataset_n_samples(ds) && l->n < max_total; i++) {
        const uint32_t *tok;
        const uint8_t *mask;
        uint32_t len;
        if ((rc = dataset_sample(ds, i, &tok, &mask, &len)) < 0) {
            df_err(err, errlen, rc, "%s: sample %llu: %s", path, (unsigned long long)i, strerror(-rc));
            break;
        }
        uint32_t n = 0;
        while (n < len && !mask[n])
            n++;
        if (n == 0 || n == len)
            continue; /* no prompt, or no response: nothing to continue from */
        int32_t *t = malloc(sizeof(int32_t) * n);
        if (!t) {
            rc = -ENOMEM;
            break;
        }
        for (uint32_t j = 0; j < n; j++)
            t[j] = (int32_t)tok[j];
        char src[320];
        snprintf(src, sizeof src, "%s#%llu", path, (unsigned long long)i);
        if ((rc = add(l, t, (int)n, max_len, src)) < 0)
            break;
    }
    if (rc == -ENOMEM)
        df_err(err, errlen, rc, "%s: out of memory", path);
    dataset_close(ds);
    return rc;
}

typedef struct byte_tok {
    int bos, user, assistant, eos;
} byte_tok;

static int read_byte_tok(byte_tok *bt, const char *dir, char *err, size_t errlen)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/byte_tokenizer.json", dir);
    json_error_t je;
    json_t *o = json_load_file(path, 0, &je);
    if (!o)
        return df_err(err, errlen, -EINVAL,
                      "%s: %s: chat JSONL prompts need the byte-level tokenizer; for another tokenizer run "
                      "scripts/prepare_data.py and pass the .dfs shard",
                      path, je.text);
    int rc = 0;
    const char *keys[4] = {"bos", "user", "assistant", "eos"};
    int *dst[4] = {&bt->bos, &bt->user, &bt->assistant, &bt->eos};
    for (int i = 0; i < 4; i++) {
        json_t *v = json_object_get(o, keys[i]);
        /* a token id is a row of the embedding: a negative one would be read before the
         * table, and one past int would wrap (the vocabulary check comes per prompt) */
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
            rc = df_err(err, errlen, -EINVAL, "%s: field \"%s\" missing or not a token id (an integer in [0, %d])",
                        path, keys[i], INT32_MAX);
            break;
        }
        *dst[i] = (int)json_integer_value(v);
    }
    json_decref(o);
    return rc;
}

int prompts_byte_tokenizer_eos(const char *dir)
{
    byte_tok bt;
    char err[64];
    return read_byte_tok(&bt, dir, err, sizeof err) < 0 ? -1 : bt.eos;
}

/* Room for one more token in t[cap]. */
static int grow(int32_t **t, int n, int *cap)
{
    if (n < *cap)
        return 0;
    int nc = *cap ? 2 * *cap : 256;
    int32_t *p = realloc(*t, sizeof(int32_t) * (size_t)nc);
    if (!p)
        return -ENOMEM;
    *t = p, *cap = nc;
    return 0;
}

/* Append the latin-1 bytes of UTF-8 text s (code points above 0xFF become '?', as
 * Python's encode("latin-1", errors="replace")). */
static int push_text(int32_t **t, int *n, int *cap, const char *s, size_t len)
{
    for (size_t i = 0; i < len;) {
        unsigned char c = (unsigned char)s[i];
        uint32_t cp;
        int k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
        cp = k == 1 ? c : k == 2 ? (c & 0x1Fu) : k == 3 ? (c & 0x0Fu) : (c & 0x07u);
        for (int j = 1; j < k && i + (size_t)j < len; j++)
            cp = (cp << 6) | ((unsigned char)s[i + (size_t)j] & 0x3Fu);
        i += (size_t)k; /* jansson hands us valid UTF-8 */
        if (grow(t, *n, cap) < 0)
            return -ENOMEM;
        (*t)[(*n)++] = cp <= 0xFF ? (int32_t)cp : '?';
    }
    return 0;
}

static int push_tok(int32_t **t, int *n, int *cap, int tok)
{
    if (grow(t, *n, cap) < 0)
        return -ENOMEM;
    (*t)[(*n)++] = tok;
    return 0;
}

/* One JSONL line's prompt tokens; -EINVAL with err naming the field. */
static int chat_prompt(const json_t *o, const byte_tok *bt, int32_t **out, int *out_n, char *err, size_t errlen)
{
    const json_t *msgs = json_object_get(o, "messages");
    int sharegpt = 0;
    if (!msgs) {
        msgs = json_object_get(o, "conversations");
        sharegpt = 1;
    }
    if (!json_is_array(msgs))
        return df_err(err, errlen, -EINVAL, "expected a \"messages\" or \"conversations\" list");
    int32_t *t = NULL;
    int n = 0, cap = 0, rc = push_tok(&t, &n, &cap, bt->bos);
    for (size_t i = 0; rc == 0 && i < json_array_size(msgs); i++) {
        const json_t *m = json_array_get(msgs, i);
        const char *role = json_string_value(json_object_get(m, sharegpt ? "from" : "role"));
        const json_t *content = json_object_get(m, sharegpt ? "value" : "content");
        if (!role || !json_is_string(content)) {
            rc = df_err(err, errlen, -EINVAL, "message %zu: expected a string \"%s\" and a string \"%s\"", i,
                        sharegpt ? "from" : "role", sharegpt ? "value" : "content");
            break;
        }
        if (!strcmp(role, "assistant") || !strcmp(role, "gpt"))
            break; /* the prompt ends before the first answer */
        if (strcmp(role, "user") && strcmp(role, "human") && strcmp(role, "system")) {
            rc = df_err(err, errlen, -EINVAL, "message %zu: role \"%s\" is not user, system or assistant", i, role);
            break;
        }
        if ((rc = push_tok(&t, &n, &cap, bt->user)) == 0)
            rc = push_text(&t, &n, &cap, json_string_value(content), json_string_length(content));
    }
    if (rc == 0)
        rc = push_tok(&t, &n, &cap, bt->assistant);
    if (rc < 0) {
        if (rc == -ENOMEM)
            df_err(err, errlen, rc, "out of memory");
        free(t);
        return rc;
    }
    *out = t, *out_n = n;
    return 0;
}

static int load_jsonl(prompts_list *l, const char *path, const char *tokenizer_dir, int vocab, int max_total,
                      int max_len, char *err, size_t errlen)
{
    byte_tok bt;
    int rc = read_byte_tok(&bt, tokenizer_dir, err, errlen);
    if (rc < 0)
        return rc;
    /* regular files only: a FIFO or a device named as the prompts file is refused at once
     * (a FIFO would block the open, /dev/zero would be read without end) */
    int fd = df_open_regular(path, NULL, err, errlen);
    if (fd < 0)
        return fd;
    FILE *f = fdopen(fd, "r");
    if (!f) {
        rc = -errno;
        close(fd);
        return df_err(err, errlen, rc, "%s: %s", path, strerror(-rc));
    }
    char *line = NULL;
    size_t lcap = 0;
    ssize_t got;
    long lineno = 0;
    while (rc == 0 && l->n < max_total && (got = getline(&line, &lcap, f)) >= 0) {
        lineno++;
        size_t i = 0;
        while (i < (size_t)got && (line[i] == ' ' || line[i] == '\t' || line[i] == '\n' || line[i] == '\r'))
            i++;
        if (i == (size_t)got)
            continue;
        json_error_t je;
        json_t *o = json_loadb(line, (size_t)got, 0, &je);
        char why[512];
        int32_t *t = NULL;
        int n = 0;
        if (!o) {
            rc = df_err(err, errlen, -EINVAL, "%s:%ld: column %d: %s", path, lineno, je.column, je.text);
            break;
        }
        rc = chat_prompt(o, &bt, &t, &n, why, sizeof why);
        json_decref(o);
        if (rc < 0) {
            df_err(err, errlen, rc, "%s:%ld: %s", path, lineno, why);
            break;
        }
        for (int j = 0; j < n; j++)
            if (t[j] < 0 || t[j] >= vocab) {
                rc = df_err(err, errlen, -EINVAL, "%s:%ld: token %d is outside the target's vocabulary (%d)", path,
                            lineno, t[j], vocab);
                break;
            }
        if (rc < 0) {
            free(t);
            break;
        }
        char src[320];
        snprintf(src, sizeof src, "%s:%ld", path, lineno);
        if ((rc = add(l, t, n, max_len, src)) < 0)
            df_err(err, errlen, rc, "%s: out of memory", path);
    }
    if (rc == 0 && ferror(f))
        rc = df_err(err, errlen, -EIO, "%s: read error", path);
    free(line);
    fclose(f);
    return rc;
}

int prompts_load(prompts_list *l, const char *path, const char *tokenizer_dir, int vocab, int max_total, int max_len,
                 char *err, size_t errlen)
{
    size_t n = strlen(path);
    if (n > 4 && !strcmp(path + n - 4, ".dfs"))
        return load_shard(l, path, vocab, max_total, max_len, err, errlen);
    return load_jsonl(l, path, tokenizer_dir, vocab, max_total, max_len, err, errlen);
}
