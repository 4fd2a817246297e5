/* control.c: the control socket <run_dir>/ctl.sock that dfctl talks to.
 *
 * Unix stream socket, mode 0600 (only the run's owner may steer it). Protocol: one JSON
 * object per line each way. Requests: {"cmd":"status"}, {"cmd":"stop|start|restart|kill",
 * "worker":"<name>"}, {"cmd":"pause"}, {"cmd":"resume"}, {"cmd":"checkpoint"},
 * {"cmd":"shutdown"}. Replies: the status object for status, else {"ok":true,"msg":...};
 * errors are {"ok":false,"error":"...","code":2} (2 = bad request: unknown command or
 * worker; 1 = the request is valid but cannot be done now). Clients may send several
 * requests on one connection; replies come in order, one per non-empty line (an empty line
 * gets none). The whole line is the request (a NUL byte in it makes it bad). A client is
 * dropped when it sends a megabyte without a newline, or leaves a megabyte of replies unread.
 * tests/test_ctl_garbage.sh attacks a live run's socket with all of this and worse.
 */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "orch.h"
#include "util.h"

#define CTL_MAX_UNSENT (1u << 20) /* bytes of replies queued for one client before it is dropped */

typedef struct ctl_client {
    uv_pipe_t pipe;
    orch *o;
    char *buf; /* bytes received, not yet a full line */
    size_t len, cap;
} ctl_client;

typedef struct write_req {
    uv_write_t req;
    char *data;
} write_req;

static void client_closed(uv_handle_t *h)
{
    ctl_client *c = h->data;
    free(c->buf);
    free(c);
}

static void write_done(uv_write_t *req, int status)
{
    write_req *wr = (write_req *)req;
    (void)status;
    free(wr->data);
    free(wr);
}

static void reply(ctl_client *c, json_t *r)
{
    char *s = json_dumps(r, JSON_COMPACT);
    json_decref(r);
    if (!s)
        return;
    size_t n = strlen(s);
    char *d = realloc(s, n + 2);
    if (!d) {
        free(s);
        return;
    }
    d[n] = '\n';
    write_req *wr = malloc(sizeof *wr);
    if (!wr) {
        free(d);
        return;
    }
    wr->data = d;
    uv_buf_t b = uv_buf_init(d, (unsigned)(n + 1));
    if (uv_write(&wr->req, (uv_stream_t *)&c->pipe, &b, 1, write_done) < 0) {
        free(d);
        free(wr);
        return;
    }
    /* a client that sends requests and never reads the replies would have them queued here
     * without bound (a status reply is ~100 times its request): a megabyte unsent, drop it */
    if (c->pipe.write_queue_size > CTL_MAX_UNSENT && !uv_is_closing((uv_handle_t *)&c->pipe))
        uv_close((uv_handle_t *)&c->pipe, client_closed);
}

static json_t *err_reply(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static json_t *err_reply(int code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof msg) {
        /* a long name is cut, maybe inside a multibyte character; jansson refuses a string that
         * is not UTF-8 (json_pack gives NULL and the client got no reply): end before it */
        size_t len = sizeof msg - 1, k = len;
        while (k > 0 && ((unsigned char)msg[k - 1] & 0xC0) == 0x80)
            k--; /* continuation bytes at the end */
        unsigned char lead = k > 0 ? (unsigned char)msg[k - 1] : 0;
        if (lead >= 0xC0 && len - (k - 1) < (lead >= 0xF0 ? 4u : lead >= 0xE0 ? 3u : 2u))
            msg[k - 1] = 0;
    }
    return json_pack("{s:b, s:s, s:i}", "ok", 0, "error", msg, "code", code);
}

static json_t *ok_reply(const char *msg)
{
    return json_pack("{s:b, s:s}", "ok", 1, "msg", msg);
}

static json_t *worker_cmd(orch *o, const char *cmd, const char *name)
{
    if (!name)
        return err_reply(2, "%s: needs a worker name", cmd);
    int i = topology_find_worker(&o->t, name);
    if (i < 0) {
        char names[1024];
        size_t len = 0;
        names[0] = 0;
        for (int k = 0; k < o->n && len < sizeof names - 40; k++)
            len += (size_t)snprintf(names + len, sizeof names - len, "%s%s", k ? ", " : "", o->w[k].tw->name);
        return err_reply(2, "unknown worker \"%s\" (workers: %s)", name, names);
    }
    orch_worker *w = &o->w[i];
    int rc;
    if (!strcmp(cmd, "stop"))
        rc = supervisor_cmd_stop(o, w);
    else if (!strcmp(cmd, "start"))
        rc = supervisor_cmd_start(o, w);
    else if (!strcmp(cmd, "restart"))
        rc = supervisor_cmd_restart(o, w);
    else
        rc = supervisor_cmd_kill(o, w);
    orch_event(o, json_pack("{s:s, s:s, s:s, s:i}", "ev", "dfctl", "cmd", cmd, "worker", name, "rc", rc));
    if (rc == -EALREADY)
        return err_reply(1, "%s: %s is already %s", cmd, name, status_state_name(w->state));
    if (rc == -ESRCH)
        return err_reply(1, "%s: %s is not running (%s)", cmd, name, status_state_name(w->state));
    if (rc == -EBUSY) /* the exited state: the process is gone, its handles close (milliseconds) */
        return err_reply(1, "%s: %s has just exited and is being reaped: try again in a moment", cmd, name);
    if (rc == -ESHUTDOWN)
        return err_reply(1, "%s: the run is shutting down", cmd);
    if (rc < 0)
        return err_reply(1, "%s %s: %s", cmd, name, strerror(-rc));
    char msg[128];
    snprintf(msg, sizeof msg, "%s %s: ok", cmd, name);
    json_t *r = ok_reply(msg);
    /* stop: SIGTERM is sent, the exit follows; SIGKILL comes after shutdown_timeout_ms at the
     * latest. dfctl waits that long (plus the reap) for the worker to be down. */
    if (!strcmp(cmd, "stop"))
        json_object_set_new(r, "wait_ms", json_integer((json_int_t)o->t.sup.shutdown_timeout_ms));
    return r;
}

static json_t *handle(orch *o, const char *line, size_t len)
{
    json_error_t jerr;
    json_t *req = json_loadb(line, len, 0, &jerr); /* the whole line: json_loads stopped at a NUL byte */
    if (!json_is_object(req)) {
        json_decref(req);
        return err_reply(2, "request is not a JSON object: %s", jerr.text);
    }
    const char *cmd = json_string_value(json_object_get(req, "cmd"));
    const char *worker = json_string_value(json_object_get(req, "worker"));
    json_t *r;
    if (!cmd) {
        r = err_reply(2, "request has no \"cmd\"");
    } else if (!strcmp(cmd, "status")) {
        r = report_status_json(o);
    } else if (!strcmp(cmd, "stop") || !strcmp(cmd, "start") || !strcmp(cmd, "restart") || !strcmp(cmd, "kill")) {
        r = worker_cmd(o, cmd, worker);
    } else if (!strcmp(cmd, "pause") || !strcmp(cmd, "resume")) {
        atomic_store_explicit(&o->status->pause, !strcmp(cmd, "pause"), memory_order_release);
        orch_event(o, json_pack("{s:s, s:s}", "ev", "dfctl", "cmd", cmd));
        r = ok_reply(!strcmp(cmd, "pause") ? "paused: workers hold before new work" : "resumed");
    } else if (!strcmp(cmd, "checkpoint")) {
        uint64_t g = atomic_fetch_add_explicit(&o->status->checkpoint_gen, 1, memory_order_acq_rel) + 1;
        orch_event(o, json_pack("{s:s, s:s, s:I}", "ev", "dfctl", "cmd", cmd, "gen", (json_int_t)g));
        r = ok_reply("checkpoint requested: the drafter commits at its next step");
    } else if (!strcmp(cmd, "shutdown")) {
        orch_event(o, json_pack("{s:s, s:s}", "ev", "dfctl", "cmd", cmd));
        supervisor_begin_shutdown(o, 0, "dfctl shutdown");
        r = ok_reply("shutting down: draining the pipeline");
    } else {
        r = err_reply(2,
                      "unknown command \"%s\" (status, stop, start, restart, kill, pause, resume, checkpoint, "
                      "shutdown)",
                      cmd);
    }
    json_decref(req);
    return r;
}

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    ctl_client *c = h->data;
    (void)suggested;
    if (c->cap - c->len < 4096) {
        size_t nc = c->cap ? c->cap * 2 : 8192;
        char *nb = nc <= (1u << 20) ? realloc(c->buf, nc) : NULL;
        if (!nb) {
            *buf = uv_buf_init(NULL, 0);
            return;
        }
        c->buf = nb;
        c->cap = nc;
    }
    *buf = uv_buf_init(c->buf + c->len, (unsigned)(c->cap - c->len));
}

static void read_cb(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    ctl_client *c = s->data;
    (void)buf;
    if (n < 0) {
        if (!uv_is_closing((uv_handle_t *)s))
            uv_close((uv_handle_t *)s, client_closed);
        return;
    }
    c->len += (size_t)n;
    /* every complete line, then one move of the rest: a move per line made a read of many
     * short lines quadratic (8 MB of empty lines after a long line held the loop for 36 s) */
    size_t off = 0;
    char *nl;
    while (!uv_is_closing((uv_handle_t *)s) && (nl = memchr(c->buf + off, '\n', c->len - off)) != NULL) {
        size_t n_line = (size_t)(nl - (c->buf + off));
        if (n_line > 0)
            reply(c, handle(c->o, c->buf + off, n_line));
        off += n_line + 1;
    }
    if (uv_is_closing((uv_handle_t *)s)) /* reply() dropped it, or the run is stopping */
        return;
    memmove(c->buf, c->buf + off, c->len - off);
    c->len -= off;
    if (c->len >= (1u << 20) - 4096) { /* a megabyte without a newline: not a client of ours */
        uv_close((uv_handle_t *)s, client_closed);
    }
}

static void on_connection(uv_stream_t *server, int status)
{
    orch *o = server->data;
    if (status < 0)
        return;
    ctl_client *c = calloc(1, sizeof *c);
    if (!c)
        return;
    c->o = o;
    uv_pipe_init(o->loop, &c->pipe, 0);
    c->pipe.data = c;
    if (uv_accept(server, (uv_stream_t *)&c->pipe) < 0) {
        uv_close((uv_handle_t *)&c->pipe, client_closed);
        return;
    }
    uv_read_start((uv_stream_t *)&c->pipe, alloc_cb, read_cb);
}

int control_start(orch *o, char *err, size_t errlen)
{
    snprintf(o->ctl_path, sizeof o->ctl_path, "%s/ctl.sock", o->run_dir);
    if (strlen(o->ctl_path) >= 108)
        return df_err(err, errlen, -ENAMETOOLONG, "%s: path too long for a unix socket (max 107 bytes)", o->ctl_path);
    (void)unlink(o->ctl_path); /* a stale socket from a previous (resumed) run */
    uv_pipe_init(o->loop, &o->ctl_server, 0);
    o->ctl_server.data = o;
    o->ctl_server_open = 1;
    mode_t old = umask(0177); /* the socket is created 0600 */
    int rc = uv_pipe_bind(&o->ctl_server, o->ctl_path);
    umask(old);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&o->ctl_server, 16, on_connection);
    if (rc < 0)
        return df_err(err, errlen, rc, "%s: %s", o->ctl_path, uv_strerror(rc));
    (void)chmod(o->ctl_path, 0600);
    return 0;
}

static void server_closed(uv_handle_t *h)
{
    (void)h;
}

static void close_client(uv_handle_t *h, void *arg)
{
    orch *o = arg;
    if (h->type == UV_NAMED_PIPE && h != (uv_handle_t *)&o->ctl_server && !uv_is_closing(h) && h->data != NULL &&
        ((ctl_client *)h->data)->o == o)
        uv_close(h, client_closed);
}

void control_stop(orch *o)
{
    uv_walk(o->loop, close_client, o);
    if (o->ctl_server_open) {
        uv_close((uv_handle_t *)&o->ctl_server, server_closed);
        o->ctl_server_open = 0;
        (void)unlink(o->ctl_path);
    }
}
