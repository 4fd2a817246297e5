/* tfevents.c: TensorBoard event files (TFRecord framing, CRC32C, hand-encoded Event
 * protobufs); the format and the crash-safety rules are in tfevents.h. */
#include "io/tfevents.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* --- CRC32C ------------------------------------------------------------------------ */

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1; /* Castagnoli, bit-reflected */
        crc_table[i] = c;
    }
}

uint32_t tfevents_crc32c(uint32_t crc, const void *data, size_t n)
{
    pthread_once(&crc_once, crc_init);
    const uint8_t *p = data;
    crc = ~crc; /* the initial and final xor: a previous result continues where it ended */
    for (size_t i = 0; i < n; i++)
        crc = crc_table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}

uint32_t tfevents_masked_crc(const void *data, size_t n)
{
    uint32_t c = tfevents_crc32c(0, data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* --- protobuf wire encoding --------------------------------------------------------- */

size_t tfevents_varint(uint8_t *out, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        out[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    out[n++] = (uint8_t)v;
    return n;
}

static void put_le(uint8_t *out, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        out[i] = (uint8_t)(v >> (8 * i));
}

/* field key: (number << 3) | wire type (0 varint, 1 fixed64, 2 length-delimited, 5 fixed32) */
#define KEY(field, type) ((uint8_t)(((field) << 3) | (type)))

void tfevents_summary_init(tfevents_summary *s)
{
    s->len = 0;
    s->n = s->dropped = 0;
}

int tfevents_summary_add(tfevents_summary *s, const char *tag, size_t tag_len, double v)
{
    if (tag_len == 0) {
        s->dropped++;
        return -EINVAL;
    }
    /* Value { tag = 1 (string), simple_value = 2 (float) }, as field 1 of Summary */
    if (tag_len > TFEVENTS_SUMMARY_MAX) {
        s->dropped++;
        return -ENOSPC;
    }
    uint8_t hdr[24], tl[10];
    size_t tln = tfevents_varint(tl, tag_len);
    size_t vlen = 1 + tln + tag_len + 1 + 4;
    uint8_t vl[10];
    if (s->len + 1 + tfevents_varint(vl, vlen) + vlen > TFEVENTS_SUMMARY_MAX) {
        s->dropped++;
        return -ENOSPC;
    }
    size_t h = 0;
    hdr[h++] = KEY(1, 2);
    h += tfevents_varint(hdr + h, vlen);
    hdr[h++] = KEY(1, 2);
    memcpy(hdr + h, tl, tln);
    h += tln;
    uint8_t *o = s->buf + s->len;
    memcpy(o, hdr, h);
    memcpy(o + h, tag, tag_len);
    o += h + tag_len;
    /* a double past the float range cast to float is undefined behaviour: clamp to inf */
    float f = v > FLT_MAX ? INFINITY : v < -FLT_MAX ? -INFINITY : (float)v;
    uint32_t bits;
    memcpy(&bits, &f, 4);
    *o++ = KEY(2, 5);
    put_le(o, bits, 4);
    s->len += h + tag_len + 1 + 4;
    s->n++;
    return 0;
}

/* Event head: wall_time (1, fixed64 double) and step (2, varint; a negative step is its
 * 64-bit two's complement, 10 bytes, as protobuf encodes int64; step 0 is left out, as a
 * proto3 encoder does: absent reads as 0). Returns the bytes written (at most 20). */
static size_t event_head(uint8_t *out, double wall_time, int64_t step)
{
    uint64_t bits;
    memcpy(&bits, &wall_time, 8);
    size_t n = 0;
    out[n++] = KEY(1, 1);
    put_le(out + n, bits, 8);
    n += 8;
    if (step != 0) {
        out[n++] = KEY(2, 0);
        n += tfevents_varint(out + n, (uint64_t)step);
    }
    return n;
}

/* --- writing ------------------------------------------------------------------------ */

#define RECORD_MAX (TFEVENTS_SUMMARY_MAX + 64)

/* Frame data[n] (already at rec + 12) as one record in rec and append it with one write. */
static int write_record(tfevents_writer *w, uint8_t *rec, size_t n)
{
    if (w->fd < 0)
        return -EBADF;
    put_le(rec, n, 8);
    put_le(rec + 8, tfevents_masked_crc(rec, 8), 4);
    put_le(rec + 12 + n, tfevents_masked_crc(rec + 12, n), 4);
    size_t total = 12 + n + 4;
    ssize_t wr;
    do
        wr = write(w->fd, rec, total); /* the one write: a kill leaves the record whole or absent, or last */
    while (wr < 0 && errno == EINTR);
    if (wr == (ssize_t)total) {
        w->size += total;
        w->records++;
        return 0;
    }
    int rc = wr < 0 ? -errno : -ENOSPC;
    w->write_errors++;
    /* a partial record: cut it off, so a later record (space freed) follows whole ones only;
     * the file is this writer's alone (O_EXCL), so the size it had is known */
    if (wr > 0 && ftruncate(w->fd, (off_t)w->size) < 0) {
        close(w->fd); /* the tail is torn and stays so: write nothing more behind it */
        w->fd = -1;
    }
    return rc;
}

static int write_session_start(tfevents_writer *w, double wall_time, int64_t step)
{
    uint8_t rec[64];
    size_t n = event_head(rec + 12, wall_time, step);
    rec[12 + n++] = KEY(6, 2); /* session_log */
    rec[12 + n++] = 2;
    rec[12 + n++] = KEY(1, 0); /* status */
    rec[12 + n++] = 1;         /* START */
    return write_record(w, rec, n);
}

int tfevents_write(tfevents_writer *w, double wall_time, int64_t step, const tfevents_summary *s)
{
    if (w->fd < 0)
        return -EBADF;
    if (w->session_start) {
        int rc = write_session_start(w, wall_time, step);
        if (rc < 0)
            return rc;
        w->session_start = 0;
    }
    uint8_t rec[RECORD_MAX];
    size_t n = event_head(rec + 12, wall_time, step);
    rec[12 + n++] = KEY(5, 2); /* summary */
    n += tfevents_varint(rec + 12 + n, s->len);
    memcpy(rec + 12 + n, s->buf, s->len);
    n += s->len;
    return write_record(w, rec, n);
}

/* The host name as a file name part: [A-Za-z0-9._-] kept, anything else '_'. */
static void host_part(char *out, size_t cap)
{
    char h[256];
    if (gethostname(h, sizeof h) < 0 || !h[0])
        snprintf(h, sizeof h, "localhost");
    h[sizeof h - 1] = 0;
    size_t i = 0;
    for (; h[i] && i + 1 < cap; i++) {
        char c = h[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-' ||
                 c == '_';
        out[i] = ok ? c : '_';
    }
    out[i] = 0;
}

int tfevents_open(tfevents_writer *w, const char *dir, int session_start, char *err, size_t errcap)
{
    memset(w, 0, sizeof *w);
    w->fd = -1;
    int rc = df_mkdir_p(dir, 0700);
    if (rc < 0)
        return df_err(err, errcap, rc, "%s: %s", dir, strerror(-rc));
    char host[128];
    host_part(host, sizeof host);
    double now = df_wall_s();
    /* a restart within the same second on the same host: the next free suffix; the names
     * still sort in creation order (".1" sorts after the bare name) */
    for (int k = 0; k < 1000; k++) {
        int n = k == 0
                    ? snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%010lld.%s", dir, (long long)now, host)
                    : snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%010lld.%s.%d", dir, (long long)now,
                               host, k);
        if (n < 0 || (size_t)n >= sizeof w->path)
            return df_err(err, errcap, -ENAMETOOLONG, "%s: path too long", dir);
        w->fd = open(w->path, O_WRONLY | O_APPEND | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (w->fd >= 0 || errno != EEXIST)
            break;
    }
    if (w->fd < 0) {
        rc = -errno;
        return df_err(err, errcap, rc, "%s: %s", w->path, strerror(errno));
    }
    uint8_t rec[64];
    size_t n = event_head(rec + 12, now, 0);
    size_t vl = strlen(TFEVENTS_FILE_VERSION);
    rec[12 + n++] = KEY(3, 2); /* file_version */
    rec[12 + n++] = (uint8_t)vl;
    memcpy(rec + 12 + n, TFEVENTS_FILE_VERSION, vl);
    n += vl;
    if ((rc = write_record(w, rec, n)) < 0) {
        snprintf(err, errcap, "%s: %s", w->path, strerror(-rc));
        tfevents_close(w);
        unlink(w->path); /* no file without its version record */
        return rc;
    }
    w->session_start = session_start;
    return 0;
}

void tfevents_close(tfevents_writer *w)
{
    if (w->fd >= 0)
        close(w->fd);
    w->fd = -1;
}
