/* metrics.c: JSON-lines metrics writer and tail-style reader (see metrics.h for the
 * format, the one-write-per-line rule and the truncation rule). */
#include "io/metrics.h"
#include "io/tfevents.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Room always kept free for ,"dropped":4294967295}\n so a line can always be closed. */
#define TAIL_RESERVE (sizeof(",\"dropped\":") - 1 + 10 + 2)
#define FIELD_LIMIT (METRICS_LINE_MAX - TAIL_RESERVE)

/* --- escaping ---------------------------------------------------------------------- */

/* Length of the valid UTF-8 sequence starting at s (bytes available: n), or 0. */
static size_t utf8_seq_len(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0)
            lo = 0xA0; /* no overlong forms */
        if (c == 0xED)
            hi = 0x9F; /* no UTF-16 surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F; /* <= U+10FFFF */
    } else
        return 0;
    if (n < len || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if ((s[i] & 0xC0) != 0x80)
            return 0;
    return len;
}

long metrics_escape(char *out, size_t cap, const char *str)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *s = (const unsigned char *)str;
    size_t n = strlen(str), o = 0;
#define EMIT(ch)               \
    do {                       \
        if (o >= cap)          \
            return -1;         \
        out[o++] = (char)(ch); \
    } while (0)
    EMIT('"');
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            if (c == '"' || c == '\\') {
                EMIT('\\');
                EMIT(c);
            } else if (c < 0x20) {
                const char *short_esc = c == '\n'   ? "n"
                                        : c == '\t' ? "t"
                                        : c == '\r' ? "r"
                                        : c == '\b' ? "b"
                                        : c == '\f' ? "f"
                                                    : NULL;
                EMIT('\\');
                if (short_esc)
                    EMIT(short_esc[0]);
                else {
                    EMIT('u');
                    EMIT('0');
                    EMIT('0');
                    EMIT(hex[c >> 4]);
                    EMIT(hex[c & 15]);
                }
            } else
                EMIT(c);
            continue;
        }
        size_t k = utf8_seq_len(s + i, n - i);
        if (k == 0) { /* invalid byte: U+FFFD, resynchronise at the next byte */
            const char *rep = "\\ufffd";
            for (int j = 0; j < 6; j++)
                EMIT(rep[j]);
            i++;
            continue;
        }
        for (size_t j = 0; j < k; j++)
            EMIT(s[i + j]);
        i += k;
    }
    EMIT('"');
#undef EMIT
    return (long)o;
}

/* --- writer ------------------------------------------------------------------------ */

static int valid_worker_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= METRICS_NAME_MAX || s[0] == '.')
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
              c == '.'))
            return 0;
    }
    return 1;
}

int metrics_open(metrics_writer *w, const char *dir, const char *worker, uint32_t incarnation)
{
    w->fd = -1;
    w->lines_written = w->write_errors = 0;
    w->tb = NULL;
    if (!dir || !worker || !valid_worker_name(worker))
        return -EINVAL;
    int rc = df_mkdir_p(dir, 0700);
    if (rc < 0)
        return rc;
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s.jsonl", dir, worker) >= (int)sizeof path)
        return -ENAMETOOLONG;
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    w->fd = fd;
    w->incarnation = incarnation;
    snprintf(w->worker, sizeof w->worker, "%s", worker);
    return 0;
}

int metrics_open_tfevents(metrics_writer *w, const char *dir, int session_start, char *err, size_t errcap)
{
    if (w->tb)
        return df_err(err, errcap, -EBUSY, "%s: an event file is open already", dir);
    tfevents_writer *tb = malloc(sizeof *tb);
    if (!tb)
        return df_err(err, errcap, -ENOMEM, "%s: out of memory", dir);
    int rc = tfevents_open(tb, dir, session_start, err, errcap);
    if (rc < 0) {
        free(tb);
        return rc;
    }
    w->tb = tb;
    return 0;
}

void metrics_close(metrics_writer *w)
{
    if (w->fd >= 0)
        close(w->fd);
    w->fd = -1;
    if (w->tb) {
        tfevents_close(w->tb);
        free(w->tb);
        w->tb = NULL;
    }
}

/* The line's TensorBoard event: its numeric fields at its step, tagged "<ev>/<key>". */
static void write_event(metrics_line *l)
{
    char tag[2 * METRICS_LINE_MAX]; /* ev and key both come from buf: they fit */
    size_t pl;
    if (l->ev_len == 4 && !memcmp(l->buf + l->ev_off, "step", 4)) {
        memcpy(tag, "train", 5); /* the drafter's training step */
        pl = 5;
    } else {
        memcpy(tag, l->buf + l->ev_off, l->ev_len);
        pl = l->ev_len;
    }
    tag[pl++] = '/';
    tfevents_summary s;
    tfevents_summary_init(&s);
    for (uint32_t i = 0; i < l->n_scalars; i++) {
        size_t tl = pl + l->scalars[i].key_len;
        memcpy(tag + pl, l->buf + l->scalars[i].key_off, l->scalars[i].key_len);
        if (l->scalars[i].elem) /* an array's element i: "<key>_<i>" (1-based) */
            tl += (size_t)snprintf(tag + tl, sizeof tag - tl, "_%u", (unsigned)l->scalars[i].elem);
        tfevents_summary_add(&s, tag, tl, l->scalars[i].v);
    }
    if (s.n > 0)
        tfevents_write(l->w->tb, l->t, l->step, &s); /* a failure is counted there, never fails the line */
}

static int put(metrics_line *l, const char *s, size_t n)
{
    if (l->len + n > FIELD_LIMIT)
        return 0;
    memcpy(l->buf + l->len, s, n);
    l->len += n;
    return 1;
}

static int put_str(metrics_line *l, const char *s)
{
    long n = metrics_escape(l->buf + l->len, FIELD_LIMIT - l->len, s);
    if (n < 0)
        return 0;
    l->len += (size_t)n;
    return 1;
}

/* Append ,"key":<raw value> whole, or nothing (and count it dropped). Returns 1 if it was
 * appended; *key_off, *key_len: where the escaped key stands in buf, between its quotes. */
static int field_raw_at(metrics_line *l, const char *key, const char *val, size_t *key_off, size_t *key_len)
{
    size_t mark = l->len;
    if (put(l, ",", 1) && put_str(l, key)) {
        *key_off = mark + 2;
        *key_len = l->len - mark - 3;
        if (put(l, ":", 1) && put(l, val, strlen(val)))
            return 1;
    }
    l->len = mark;
    l->dropped++;
    return 0;
}

static void field_raw(metrics_line *l, const char *key, const char *val)
{
    size_t off, len;
    field_raw_at(l, key, val, &off, &len);
}

/* A numeric field that was written: remember it for the TensorBoard event ("step" is the
 * event's step, not a scalar). */
static void scalar_field(metrics_line *l, const char *key, const char *val, double v, int is_int, int64_t iv)
{
    size_t off, len;
    if (!field_raw_at(l, key, val, &off, &len) || !l->w->tb)
        return;
    if (is_int && !strcmp(key, "step")) {
        l->has_step = 1;
        l->step = iv;
    } else if (l->n_scalars < METRICS_SCALARS_MAX) {
        l->scalars[l->n_scalars].key_off = (uint16_t)off; /* < METRICS_LINE_MAX */
        l->scalars[l->n_scalars].key_len = (uint16_t)len;
        l->scalars[l->n_scalars].elem = 0;
        l->scalars[l->n_scalars].v = v;
        l->n_scalars++;
    }
}

void metrics_begin(metrics_line *l, metrics_writer *w, const char *ev)
{
    char head[160];
    l->w = w;
    l->dropped = 0;
    l->len = 0;
    l->t = df_wall_s();
    l->has_step = 0;
    l->n_scalars = 0;
    snprintf(head, sizeof head, "{\"t\":%.6f,\"worker\":", l->t);
    put(l, head, strlen(head));
    put_str(l, w->worker); /* validated short name: always fits */
    snprintf(head, sizeof head, ",\"inc\":%u,\"pid\":%d,\"ev\":", w->incarnation, (int)getpid());
    put(l, head, strlen(head));
    size_t mark = l->len;
    if (!put_str(l, ev ? ev : "")) /* an absurdly long event name: keep the line valid */
        put(l, "\"?\"", 3);
    l->ev_off = (uint16_t)(mark + 1);
    l->ev_len = (uint16_t)(l->len - mark - 2);
}

/* v as metrics_num writes it, into num[40] */
static void fmt_num(char *num, double v)
{
    if (!isfinite(v))
        snprintf(num, 40, "null");
    else {
        snprintf(num, 40, "%.15g", v);
        if (strtod(num, NULL) != v) /* shortest form that reads back exactly */
            snprintf(num, 40, "%.17g", v);
        if (!strpbrk(num, ".e")) /* keep it a real for typed readers (jansson): 42 -> 42.0 */
            strcat(num, ".0");
    }
}

void metrics_num(metrics_line *l, const char *key, double v)
{
    char num[40];
    fmt_num(num, v);
    scalar_field(l, key, num, v, 0, 0);
}

void metrics_nums(metrics_line *l, const char *key, const double *v, int n)
{
    char arr[METRICS_LINE_MAX], num[40];
    size_t len = 0;
    arr[len++] = '[';
    for (int i = 0; i < n; i++) {
        fmt_num(num, v[i]);
        size_t k = strlen(num);
        if (len + k + 2 >= sizeof arr) { /* cannot fit any line: dropped whole */
            l->dropped++;
            return;
        }
        if (i)
            arr[len++] = ',';
        memcpy(arr + len, num, k);
        len += k;
    }
    arr[len++] = ']';
    arr[len] = 0;
    size_t off, klen;
    if (!field_raw_at(l, key, arr, &off, &klen) || !l->w->tb)
        return;
    /* each element is a scalar of the TensorBoard event, tagged <key>_1 .. <key>_n */
    for (int i = 0; i < n && l->n_scalars < METRICS_SCALARS_MAX; i++) {
        l->scalars[l->n_scalars].key_off = (uint16_t)off;
        l->scalars[l->n_scalars].key_len = (uint16_t)klen;
        l->scalars[l->n_scalars].elem = (uint16_t)(i + 1);
        l->scalars[l->n_scalars].v = v[i];
        l->n_scalars++;
    }
}

void metrics_int(metrics_line *l, const char *key, int64_t v)
{
    char num[32];
    snprintf(num, sizeof num, "%lld", (long long)v);
    scalar_field(l, key, num, (double)v, 1, v);
}

void metrics_u64(metrics_line *l, const char *key, uint64_t v)
{
    char num[32];
    snprintf(num, sizeof num, "%llu", (unsigned long long)v);
    field_raw(l, key, num);
}

void metrics_bool(metrics_line *l, const char *key, int v)
{
    field_raw(l, key, v ? "true" : "false");
}

void metrics_str(metrics_line *l, const char *key, const char *v)
{
    if (!v) {
        field_raw(l, key, "null");
        return;
    }
    size_t mark = l->len;
    if (put(l, ",", 1) && put_str(l, key) && put(l, ":", 1) && put_str(l, v))
        return;
    l->len = mark;
    l->dropped++;
}

int metrics_end(metrics_line *l)
{
    metrics_writer *w = l->w;
    char tail[40];
    /* TAIL_RESERVE guarantees room: write straight into buf past FIELD_LIMIT. */
    int n =
        l->dropped ? snprintf(tail, sizeof tail, ",\"dropped\":%u}\n", l->dropped) : snprintf(tail, sizeof tail, "}\n");
    memcpy(l->buf + l->len, tail, (size_t)n);
    l->len += (size_t)n;
    if (w->fd < 0)
        return -EBADF;
    ssize_t wr;
    do
        wr = write(w->fd, l->buf, l->len); /* the one write: O_APPEND keeps lines whole */
    while (wr < 0 && errno == EINTR);
    if (wr < 0) {
        w->write_errors++;
        return -errno;
    }
    if ((size_t)wr < l->len) { /* a full disk: take the partial line back (one writer a file) */
        w->write_errors++;
        off_t end = lseek(w->fd, 0, SEEK_END);
        if (end < (off_t)wr || ftruncate(w->fd, end - (off_t)wr) < 0) {
            ssize_t r2;
            do
                r2 = write(w->fd, "\n", 1); /* could not: end it, one bad line a reader skips */
            while (r2 < 0 && errno == EINTR);
        }
        return -ENOSPC;
    }
    w->lines_written++;
    if (w->tb && l->has_step) /* after the line: the event never holds what the JSONL lacks */
        write_event(l);
    return 0;
}

/* --- reader ------------------------------------------------------------------------ */

int metrics_reader_open(metrics_reader *r, const char *path)
{
    memset(r, 0, sizeof *r);
    r->fd = -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    r->cap = 64 * 1024;
    r->buf = malloc(r->cap);
    if (!r->buf) {
        close(fd);
        return -ENOMEM;
    }
    r->fd = fd;
    return 0;
}

void metrics_reader_close(metrics_reader *r)
{
    if (r->fd >= 0)
        close(r->fd);
    free(r->buf);
    memset(r, 0, sizeof *r);
    r->fd = -1;
}

/* Read more bytes after the buffered ones. 1 = got some, 0 = at EOF, -errno. */
static int reader_fill(metrics_reader *r)
{
    if (r->start > 0) { /* compact: the partial line moves to the front */
        memmove(r->buf, r->buf + r->start, r->len - r->start);
        r->len -= r->start;
        r->start = 0;
    }
    if (r->len == r->cap) {
        size_t ncap = r->cap * 2;
        char *nb = realloc(r->buf, ncap);
        if (!nb)
            return -ENOMEM;
        r->buf = nb;
        r->cap = ncap;
    }
    for (;;) {
        ssize_t n = pread(r->fd, r->buf + r->len, r->cap - r->len, (off_t)r->offset);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (n > 0) {
            r->len += (size_t)n;
            r->offset += (uint64_t)n;
            return 1;
        }
        struct stat st;
        if (fstat(r->fd, &st) < 0)
            return -errno;
        if ((uint64_t)st.st_size < r->offset) { /* rewritten from scratch: start over */
            r->truncations++;
            r->offset = r->consumed = 0;
            r->start = r->len = 0;
            r->skipping = 0;
            continue;
        }
        return 0;
    }
}

int metrics_reader_next(metrics_reader *r, json_t **obj)
{
    *obj = NULL;
    if (r->fd < 0)
        return -EBADF;
    for (;;) {
        char *p = r->start < r->len ? memchr(r->buf + r->start, '\n', r->len - r->start) : NULL;
        if (!p) {
            if (r->skipping) { /* drop the over-long line's bytes as they come */
                r->start = r->len = 0;
            } else if (r->len - r->start >= METRICS_READER_MAX_LINE) {
                r->skipping = 1;
                r->start = r->len = 0;
            }
            int rc = reader_fill(r);
            if (rc <= 0)
                return rc;
            continue;
        }
        char *line = r->buf + r->start;
        size_t n = (size_t)(p - line);
        r->start += n + 1;
        r->consumed = r->offset - (r->len - r->start);
        if (r->skipping) {
            r->skipping = 0;
            r->bad_lines++;
            continue;
        }
        size_t k = 0;
        while (k < n && (line[k] == ' ' || line[k] == '\t' || line[k] == '\r'))
            k++;
        if (k == n)
            continue; /* blank line */
        json_error_t err;
        json_t *j = json_loadb(line, n, 0, &err);
        if (!j || !json_is_object(j)) {
            json_decref(j);
            r->bad_lines++;
            continue;
        }
        r->lines++;
        *obj = j;
        return 1;
    }
}
