/* tfevents.h: TensorBoard event files, written in C without TensorFlow.
 *
 * A worker's scalar metrics also go to <run>/tensorboard/<worker>/events.out.tfevents.*,
 * the files `tensorboard --logdir <run>/tensorboard` reads (docs/operations.md,
 * "TensorBoard"). The file is a sequence of TFRecord records, each
 *     uint64 length (little-endian) | uint32 masked CRC32C of those 8 bytes |
 *     data[length] | uint32 masked CRC32C of data
 * where mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8 and CRC32C is the Castagnoli CRC
 * (reflected polynomial 0x82f63b78, initial and final xor 0xffffffff). Every record's data
 * is one serialized Event message of the public event schema, encoded here by hand:
 *     Event    { double wall_time = 1; int64 step = 2; string file_version = 3;
 *                Summary summary = 5; SessionLog session_log = 6; }
 *     Summary  { repeated Value value = 1; }
 *     Value    { string tag = 1; float simple_value = 2; }
 *     SessionLog { enum status = 1 (START = 1); }
 * The first record of a file carries file_version "brain.Event:2"; then one Event per
 * tfevents_write (one step's scalars).
 *
 * Crash safety: each record is built whole in memory and written with ONE write(2) on an
 * O_APPEND descriptor, so a killed worker leaves every record but perhaps the last whole
 * (TensorBoard reads up to the last complete record). A short write (disk full, file size
 * limit) is cut off again with ftruncate, so the file never holds a torn record followed by
 * good ones. Each tfevents_open creates a NEW file (O_EXCL): a restarted worker never
 * appends behind a torn tail, and TensorBoard reads every file of the directory in name
 * (= time) order. With session_start set, the first step written by this file is preceded
 * by an Event with SessionLog START at that step: TensorBoard then drops what an earlier
 * file of the same directory logged at that step or later (a drafter restarted from its
 * last checkpoint redoes those steps, and the curve should not show both).
 *
 * A writer is for one thread (or lock around it). */
#ifndef DF_TFEVENTS_H
#define DF_TFEVENTS_H

#include <stddef.h>
#include <stdint.h>

#define TFEVENTS_SUMMARY_MAX 8192 /* bytes of one Summary message */
#define TFEVENTS_FILE_VERSION "brain.Event:2"

typedef struct tfevents_writer {
    int fd;                /* O_APPEND, close-on-exec; -1 when closed */
    uint64_t size;         /* bytes of whole records in the file: a short write is cut back to it */
    uint64_t records;      /* records written, the file_version one included */
    uint64_t write_errors; /* records that could not be written (then absent from the file) */
    int session_start;     /* a START SessionLog is still to precede the first summary */
    char path[4096];
} tfevents_writer;

/* One Event's scalars, built on the caller's stack, then written by tfevents_write. */
typedef struct tfevents_summary {
    size_t len;       /* bytes used in buf: serialized Summary.Value entries */
    uint32_t n;       /* values added */
    uint32_t dropped; /* values that did not fit (or had an empty tag) */
    uint8_t buf[TFEVENTS_SUMMARY_MAX];
} tfevents_summary;

/* Create dir (0700, parents too) and in it a new file events.out.tfevents.<unix time>.<host>
 * (".<n>" appended when that name exists already), mode 0600; write its file_version record.
 * session_start: see above. 0 or -errno, err says what failed. */
int tfevents_open(tfevents_writer *w, const char *dir, int session_start, char *err, size_t errcap);
void tfevents_close(tfevents_writer *w);

void tfevents_summary_init(tfevents_summary *s);
/* Add Value { tag = tag[0..tag_len), simple_value = v rounded to float } (beyond the float
 * range: an infinity of its sign; NaN and infinities are kept). 0, or -ENOSPC when it does
 * not fit (the summary is unchanged, s->dropped counts it), -EINVAL for an empty tag. */
int tfevents_summary_add(tfevents_summary *s, const char *tag, size_t tag_len, double v);
/* Write Event { wall_time, step, summary = s } as one record (after the START record when one
 * is due). 0, or -errno (-ENOSPC for a short write, cut off again); -EBADF when closed. */
int tfevents_write(tfevents_writer *w, double wall_time, int64_t step, const tfevents_summary *s);

/* The pieces, exposed for tests. */
uint32_t tfevents_crc32c(uint32_t crc, const void *data, size_t n); /* crc: 0 to start, or a previous result */
uint32_t tfevents_masked_crc(const void *data, size_t n);
size_t tfevents_varint(uint8_t *out, uint64_t v); /* out: 10 bytes of room; returns the bytes written */

#endif
