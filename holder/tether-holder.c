/*
 * tether-holder: holds one program on a PTY so that it outlives the Tether worker (and the `docker exec`)
 * that started it, and lets any later worker attach again. The protocol is docs/holder.md.
 *
 *   tether-holder serve  DIR [--ring BYTES] [--cols N] [--rows N] [--linger SECONDS] [--cwd DIR]
 *                             [--setenv NAME=VALUE]... -- ARGV...
 *       The session's secret is the first line on stdin (never argv or the environment). Starts the holder
 *       in the background, prints "holder PID START program PID\n" once it listens, and exits 0 (1 with
 *       "error TEXT\n" when nothing was started). With --reap (a container whose PID 1 may reap nothing)
 *       it stays instead, a child subreaper with no output of its own, until it has reaped the holder and
 *       everything orphaned below it.
 *       --setenv is for the program only (Tether's process marker: the holder must not carry it).
 *   tether-holder attach DIR     relays stdin/stdout to DIR/sock, bytes unchanged (for a `docker exec`
 *                                without a terminal, whose stdin docker never scans for detach keys).
 *   tether-holder forget DIR     removes DIR once no holder lives in it (the end is on record elsewhere).
 *   tether-holder status DIR     "exit RECORD" once the program has ended, "running holder ..." while the
 *                                holder lives, "gone" when it does not, "none" when nothing is there.
 *   tether-holder mux -- ARGV    runs ARGV on pipes and speaks for it in lines over its own terminal
 *                                (a command with `pty: false`): see mux() below.
 *
 * One file, no dependencies beyond libc; built static (musl-gcc, or gcc -static) so it runs in any
 * Linux container whatever its libc. It never dies of a client: every client error drops that client.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#define HEADER 5                       /* 1 byte type, 4 bytes big-endian length */
#define MAX_FRAME (1024 * 1024)        /* a longer frame is a bad client */
#define CHUNK (64 * 1024)              /* output bytes per frame */
#define MAX_SECRET 128
#define PENDING 4                      /* connections not yet authenticated */
#define AUTH_MS 5000                   /* ...each gets this long to send its attach */
#define QUIET_MS 50                    /* after the program's end: output silent this long has ended */
#define INPUT_FRAME (64 * 1024)          /* bytes in one input frame */
#define INPUT_HIGH INPUT_FRAME           /* input waiting for the program: above this, the client waits */

/* frames */
enum {
    F_ATTACH = 'A',  /* client: secret, then 8 bytes since */
    F_ATTACH_SCREEN = 'B', /* client: as A, and the answer is followed by the screen kept (a P frame) */
    F_SCREEN = 'P',  /* client: 8 bytes offset, then the screen there (at most CHUNK); holder: the same, or empty */
    F_INPUT = 'I',   /* client: bytes for the program */
    F_RESIZE = 'R',  /* client: 2 bytes cols, 2 bytes rows */
    F_ACK = 'C',     /* client: 8 bytes, output before it need not be kept */
    F_KILL = 'K',    /* client: 4 bytes grace ms; end the program's whole session */
    F_QUIT = 'Q',    /* client: the holder may go once the program has ended and the end was sent */
    F_ATTACHED = 'S',/* holder: 8 resume, 8 lost, 8 total, 4 program pid, 1 ended */
    F_OUTPUT = 'O',  /* holder: 8 offset, then the bytes */
    F_EXIT = 'E',    /* holder: the exit record's text, after the last output */
    F_ERROR = 'Z',   /* holder: why the connection is closed */
};

struct conn {
    int fd;
    long long since_ms;               /* accepted at (pending ones) */
    unsigned char in[HEADER + MAX_FRAME];
    size_t in_len;
    unsigned char out[HEADER + 8 + CHUNK];
    size_t out_len, out_pos;
    int screen_due;                   /* the screen kept is sent after the attach's answer */
};

static const char *dir;
static char secret[MAX_SECRET + 1];
static size_t secret_len;
static unsigned char *ring;
static size_t ring_size = 1024 * 1024;
static uint64_t total;   /* bytes ever read from the PTY */
static uint64_t base;    /* oldest offset kept: [base, total) is in the ring */
static uint64_t sent;    /* the client's next offset */
static int master = -1, listener = -1, sigfd = -1;
static pid_t program;
static int ended;        /* the program was reaped */
static int status_word;
static int pty_eof;
static long long ended_ms, last_output_ms;
static int exit_sent;
static long linger_s = 3600;
static struct conn *client;
static struct conn *pending[PENDING];
static unsigned char input[3 * INPUT_FRAME];
static size_t input_len;
static long long kill_at_ms;     /* when the SIGKILL of a K frame is due; 0: none */
/* The screen its client last left with the holder (P): opaque bytes, as of offset screen_at. A later client
   that attaches with B gets it, so a new owner of the session rebuilds the screen where the last one was. */
static unsigned char *screen;
static size_t screen_len;
static uint64_t screen_at;

static long long now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static long long wall_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void put64(unsigned char *p, uint64_t v) { for (int i = 7; i >= 0; i--) { p[i] = v & 0xff; v >>= 8; } }
static void put32(unsigned char *p, uint32_t v) { for (int i = 3; i >= 0; i--) { p[i] = v & 0xff; v >>= 8; } }
static uint64_t get64(const unsigned char *p) { uint64_t v = 0; for (int i = 0; i < 8; i++) v = (v << 8) | p[i]; return v; }
static uint32_t get32(const unsigned char *p) { uint32_t v = 0; for (int i = 0; i < 4; i++) v = (v << 8) | p[i]; return v; }
static unsigned get16(const unsigned char *p) { return ((unsigned)p[0] << 8) | p[1]; }

static void path_in(char *buf, size_t size, const char *name) { snprintf(buf, size, "%s/%s", dir, name); }

static void set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

/* --- the exit record ------------------------------------------------------------------------------ */

static void record_exit(void) {
    char tmp[4096], final[4096], text[256];
    int n;
    if (WIFSIGNALED(status_word))
        n = snprintf(text, sizeof text, "signal=%d core=%d at=%lld pid=%d\n", WTERMSIG(status_word),
                     WCOREDUMP(status_word) ? 1 : 0, wall_ms(), (int)program);
    else
        n = snprintf(text, sizeof text, "code=%d at=%lld pid=%d\n", WEXITSTATUS(status_word), wall_ms(), (int)program);
    path_in(tmp, sizeof tmp, "exit.tmp");
    path_in(final, sizeof final, "exit");
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd >= 0) {
        if (write(fd, text, n) == n && fsync(fd) == 0) {
            close(fd);
            rename(tmp, final);
            int d = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            if (d >= 0) { fsync(d); close(d); }
        } else {
            close(fd);
        }
    }
}

static size_t exit_text(char *buf, size_t size) {
    char path[4096];
    path_in(path, sizeof path, "exit");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, size);
    close(fd);
    return n > 0 ? (size_t)n : 0;
}

/* --- ending the program's session ----------------------------------------------------------------- */

/* Every process whose session is the program's (it leads its own): the tree that did not leave it. The
   way to find it when the holder cannot be a child subreaper or read /proc/PID/task/TID/children: a pass
   over every process of the host, which costs each of many sessions ended at once as much as the host has
   processes. */
static void signal_session(int sig) {
    kill(-program, sig);  /* its process group, whoever of it left the session */
    DIR *proc = opendir("/proc");
    if (!proc) return;
    struct dirent *entry;
    while ((entry = readdir(proc))) {
        char *end;
        long pid = strtol(entry->d_name, &end, 10);
        if (*end || pid <= 1) continue;
        char path[64], stat[1024];
        snprintf(path, sizeof path, "/proc/%ld/stat", pid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        ssize_t n = read(fd, stat, sizeof stat - 1);
        close(fd);
        if (n <= 0) continue;
        stat[n] = 0;
        char *paren = strrchr(stat, ')');  /* the name may hold spaces and parentheses */
        if (!paren) continue;
        char state;
        int ppid, pgrp, session;
        if (sscanf(paren + 1, " %c %d %d %d", &state, &ppid, &pgrp, &session) == 4 && session == program)
            kill((pid_t)pid, sig);
    }
    closedir(proc);
}

static int subreaper;  /* the holder is a child subreaper: nothing the program starts can leave its tree */

struct pids { pid_t *at; size_t len, cap; };

static void pids_add(struct pids *list, pid_t pid) {
    if (list->len == list->cap) {
        size_t cap = list->cap ? list->cap * 2 : 64;
        pid_t *grown = realloc(list->at, cap * sizeof *grown);
        if (!grown) return;  /* no memory: this one is found again on the next round (its parent is stopped) */
        list->at = grown;
        list->cap = cap;
    }
    list->at[list->len++] = pid;
}

/* Appends the children of every thread of `pid`; 0 when its task directory cannot be read (it is gone, or
   the kernel has no children files: only the holder's own read tells which). */
static int children_of(pid_t pid, struct pids *out) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *tasks = opendir(path);
    if (!tasks) return 0;
    int read_any = 0;
    struct dirent *entry;
    while ((entry = readdir(tasks))) {
        char *tail;
        long tid = strtol(entry->d_name, &tail, 10);
        if (*tail || tid <= 0) continue;
        char file[96];
        snprintf(file, sizeof file, "/proc/%d/task/%ld/children", (int)pid, tid);
        int fd = open(file, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        read_any = 1;
        /* "PID PID ... ": the whole file first, so no pid is cut between two reads */
        size_t size = 4096, len = 0;
        char *text = malloc(size);
        ssize_t n;
        while (text && (n = read(fd, text + len, size - len - 1)) > 0) {
            len += (size_t)n;
            if (size - len - 1 == 0) {
                char *grown = realloc(text, size * 2);
                if (!grown) break;
                text = grown;
                size *= 2;
            }
        }
        close(fd);
        if (!text) continue;
        text[len] = 0;
        for (char *p = text; *p;) {
            char *end;
            long child = strtol(p, &end, 10);
            if (end == p) { p++; continue; }
            if (child > 0) pids_add(out, (pid_t)child);
            p = end;
        }
        free(text);
    }
    closedir(tasks);
    return read_any;
}

/* Every process below the holder: each is stopped as it is found, before its own children are read, so
   none forks or reaps behind the walk; then each gets `sig` and goes on (a pending signal is taken before it
   runs an instruction of its own). The holder is a child subreaper, so an orphan of the tree is the
   holder's child, never init's. 0 when the children files cannot be read: the caller scans the session. */
static int signal_descendants(int sig) {
    struct pids found = {0};
    if (!children_of(getpid(), &found)) { free(found.at); return 0; }
    for (size_t i = 0; i < found.len; i++) {
        kill(found.at[i], SIGSTOP);
        children_of(found.at[i], &found);
    }
    for (size_t i = 0; i < found.len; i++) kill(found.at[i], sig);
    for (size_t i = 0; i < found.len; i++) kill(found.at[i], SIGCONT);
    free(found.at);
    return 1;
}

/* Ends what the program started: its process group, and every process below the holder (or, when the
   holder cannot see its tree, every process of the program's session). */
static void signal_tree(int sig) {
    if (subreaper && signal_descendants(sig)) return;
    signal_session(sig);
    signal_session(SIGCONT);  /* a stopped job takes its HUP and TERM once it goes on */
}

/* --- connections ---------------------------------------------------------------------------------- */

static void drop(struct conn *c) {
    if (!c) return;
    close(c->fd);
    free(c);
}

/* Best effort, then the connection goes: a client that does not read is not waited for. */
static void refuse(struct conn *c, const char *why) {
    unsigned char frame[HEADER + 256];
    size_t n = strlen(why);
    if (n > 256) n = 256;
    frame[0] = F_ERROR;
    put32(frame + 1, (uint32_t)n);
    memcpy(frame + HEADER, why, n);
    ssize_t ignored = send(c->fd, frame, HEADER + n, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)ignored;
    drop(c);
}

static void queue(struct conn *c, int type, const unsigned char *payload, size_t n) {
    c->out[0] = (unsigned char)type;
    put32(c->out + 1, (uint32_t)n);
    memcpy(c->out + HEADER, payload, n);
    c->out_len = HEADER + n;
    c->out_pos = 0;
}

/* The next frame for the client when the last one is out: output from `sent`, then (once the program has
   ended and its output with it) the exit record. */
static void fill(struct conn *c) {
    if (c->out_pos < c->out_len) return;
    c->out_len = c->out_pos = 0;
    if (c->screen_due) {
        unsigned char frame[8 + CHUNK];
        size_t n = 0;
        if (screen) {
            put64(frame, screen_at);
            memcpy(frame + 8, screen, screen_len);
            n = 8 + screen_len;
        }
        queue(c, F_SCREEN, frame, n);
        c->screen_due = 0;
    } else if (sent < total) {
        size_t n = total - sent;
        if (n > CHUNK) n = CHUNK;
        size_t at = sent % ring_size;
        if (n > ring_size - at) n = ring_size - at;  /* one contiguous piece per frame */
        c->out[0] = F_OUTPUT;
        put32(c->out + 1, (uint32_t)(8 + n));
        put64(c->out + HEADER, sent);
        memcpy(c->out + HEADER + 8, ring + at, n);
        c->out_len = HEADER + 8 + n;
        sent += n;
    } else if (ended && pty_eof && !exit_sent) {
        char text[256];
        size_t n = exit_text(text, sizeof text);
        queue(c, F_EXIT, (unsigned char *)text, n);
        exit_sent = 1;
    }
}

/* Writes what it can; 0 when the client is gone. */
static int flush(struct conn *c) {
    for (;;) {
        fill(c);
        if (c->out_pos >= c->out_len) return 1;
        ssize_t n = send(c->fd, c->out + c->out_pos, c->out_len - c->out_pos, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
        c->out_pos += (size_t)n;
    }
}

static int secret_matches(const unsigned char *given, size_t n) {
    if (n != secret_len) return 0;
    unsigned char diff = 0;
    for (size_t i = 0; i < n; i++) diff |= given[i] ^ (unsigned char)secret[i];
    return diff == 0;
}

/* A pending connection's attach: with the secret it replaces the client (the newer attach wins). */
static int attach(struct conn *c, const unsigned char *payload, size_t n, int with_screen) {
    if (n < 8 || !secret_matches(payload, n - 8)) {
        refuse(c, "refused: wrong secret");
        return 0;
    }
    uint64_t since = get64(payload + n - 8), resume = since, lost = 0;
    if (resume > total) resume = total;  /* an offset from the future: nothing between */
    if (resume < base) { lost = base - resume; resume = base; }
    if (client) refuse(client, "replaced by a newer attach");
    client = c;
    sent = resume;
    exit_sent = 0;
    unsigned char reply[8 + 8 + 8 + 4 + 1];
    put64(reply, resume);
    put64(reply + 8, lost);
    put64(reply + 16, total);
    put32(reply + 24, (uint32_t)program);
    reply[28] = ended ? 1 : 0;
    queue(c, F_ATTACHED, reply, sizeof reply);
    c->screen_due = with_screen;
    return 1;
}

static void write_input(void) {
    while (input_len > 0 && master >= 0) {
        ssize_t n = write(master, input, input_len);
        if (n <= 0) {
            if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
            input_len = 0;  /* the terminal is gone: nothing will read it */
            return;
        }
        memmove(input, input + n, input_len - (size_t)n);
        input_len -= (size_t)n;
    }
}

static int quit_now;

/* One frame from the attached client; 0 drops it. */
static int client_frame(struct conn *c, int type, const unsigned char *p, size_t n) {
    switch (type) {
    case F_INPUT:
        if (n > sizeof input - input_len) return 0;  /* cannot be: frames wait above INPUT_HIGH */
        memcpy(input + input_len, p, n);
        input_len += n;
        write_input();
        return 1;
    case F_RESIZE: {
        if (n != 4) return 0;
        unsigned cols = get16(p), rows = get16(p + 2);
        if (cols < 1 || rows < 1 || cols > 1000 || rows > 1000) return 0;
        struct winsize size = {.ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols};
        if (master >= 0) ioctl(master, TIOCSWINSZ, &size);
        return 1;
    }
    case F_ACK: {
        if (n != 8) return 0;
        uint64_t offset = get64(p);
        if (offset > sent) offset = sent;  /* only what it was sent */
        if (offset > base) base = offset;
        return 1;
    }
    case F_KILL: {
        if (n != 4) return 0;
        uint32_t grace = get32(p);
        if (grace > 60000) grace = 60000;
        signal_tree(SIGHUP);
        signal_tree(SIGTERM);
        kill_at_ms = now_ms() + grace;
        return 1;
    }
    case F_QUIT:
        quit_now = 1;  /* carried out once the program has ended and its client has had the end */
        return 1;
    case F_SCREEN: {
        if (n < 8 || n > 8 + CHUNK) return 0;
        unsigned char *copy = malloc(n - 8 ? n - 8 : 1);
        if (!copy) return 1;  /* the screen kept stays the older one */
        memcpy(copy, p + 8, n - 8);
        free(screen);
        screen = copy;
        screen_len = n - 8;
        screen_at = get64(p);
        return 1;
    }
    default:
        (void)c;
        return 0;  /* an attach again, or a type nobody knows */
    }
}

/* Acts on every whole frame in the connection's buffer. Returns 0 when the connection is to go (dropped by
   the caller), -1 when it was refused and dropped here, 2 when a pending connection became the client, 1
   otherwise. The client's input waits in its buffer while the program is not reading. */
static int process(struct conn *c, int authenticated) {
    size_t at = 0;
    int result = 1;
    while (c->in_len - at >= HEADER) {
        if (authenticated && input_len > INPUT_HIGH) break;
        uint32_t len = get32(c->in + at + 1);
        if (len > MAX_FRAME || (c->in[at] == F_INPUT && len > INPUT_FRAME)) { result = 0; break; }
        if (c->in_len - at < HEADER + len) break;
        int type = c->in[at];
        const unsigned char *payload = c->in + at + HEADER;
        if (!authenticated) {
            if (type != F_ATTACH && type != F_ATTACH_SCREEN) return 0;
            unsigned char copy[MAX_SECRET + 8];
            if (len > sizeof copy) { refuse(c, "refused: wrong secret"); return -1; }
            memcpy(copy, payload, len);
            at += HEADER + len;
            memmove(c->in, c->in + at, c->in_len - at);  /* what follows is the new client's */
            c->in_len -= at;
            return attach(c, copy, len, type == F_ATTACH_SCREEN) ? 2 : -1;
        }
        at += HEADER + len;
        if (!client_frame(c, type, payload, len)) { result = 0; break; }
    }
    memmove(c->in, c->in + at, c->in_len - at);
    c->in_len -= at;
    return result;
}

/* Reads what the socket has; 0 when the peer has gone. */
static int receive(struct conn *c) {
    size_t room = sizeof c->in - c->in_len;
    if (room == 0) return 1;
    ssize_t n = recv(c->fd, c->in + c->in_len, room, MSG_DONTWAIT);
    if (n == 0) return 0;
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    c->in_len += (size_t)n;
    return 1;
}

static int wants_input(struct conn *c) { return input_len <= INPUT_HIGH && c->in_len < sizeof c->in; }

/* --- the PTY and the program ---------------------------------------------------------------------- */

static void read_pty(void) {
    while (master >= 0 && total - base < ring_size) {
        size_t at = total % ring_size, room = ring_size - (size_t)(total - base);
        if (room > ring_size - at) room = ring_size - at;
        ssize_t n = read(master, ring + at, room);
        if (n > 0) {
            total += (uint64_t)n;
            last_output_ms = now_ms();
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
        pty_eof = 1;  /* EIO: every holder of the terminal has closed it */
        close(master);
        master = -1;
        return;
    }
}

static void reap(void) {
    struct signalfd_siginfo info;
    while (read(sigfd, &info, sizeof info) == sizeof info) {}
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        if (pid == program && !ended) {
            status_word = status;
            ended = 1;
            ended_ms = now_ms();
            record_exit();
        }
    }
}

/* The exit record stays for whoever looks later (`forget` removes it once it is on record elsewhere). */
static void cleanup_files(void) {
    char path[4096];
    path_in(path, sizeof path, "sock");
    unlink(path);
    path_in(path, sizeof path, "holder");
    unlink(path);
}

static int serve_loop(void) {
    for (;;) {
        long long now = now_ms();
        /* The output has ended once the terminal closed, or once it stayed quiet a while after the end
           (a background child may keep the terminal open for ever). */
        if (ended && !pty_eof) {
            read_pty();
            if (!pty_eof && total - base < ring_size && now - (last_output_ms > ended_ms ? last_output_ms : ended_ms) >= QUIET_MS) {
                pty_eof = 1;
                if (master >= 0) { close(master); master = -1; }
            }
        }
        if (kill_at_ms && now >= kill_at_ms) {
            signal_tree(SIGKILL);
            kill_at_ms = 0;
        }
        if (quit_now && ended && pty_eof && (!client || (exit_sent && client->out_pos >= client->out_len))) return 0;
        if (ended && now - ended_ms >= linger_s * 1000) return 0;
        if (client && (process(client, 1) == 0 || !flush(client))) { drop(client); client = NULL; }

        struct pollfd fds[4 + PENDING];
        int n = 0;
        fds[n++] = (struct pollfd){.fd = sigfd, .events = POLLIN};
        fds[n++] = (struct pollfd){.fd = listener, .events = POLLIN};
        int master_at = -1, client_at = -1;
        if (master >= 0) {
            short events = 0;
            if (total - base < ring_size) events |= POLLIN;
            if (input_len) events |= POLLOUT;
            /* Not polled for nothing: once every other end of the terminal has closed it polls hung up at once,
               and a full ring (nobody reading, the program gone) kept the holder spinning a core until its
               linger ran out. */
            if (events) {
                master_at = n;
                fds[n++] = (struct pollfd){.fd = master, .events = events};
            }
        }
        if (client) {
            short events = wants_input(client) ? POLLIN : 0;
            if (client->out_pos < client->out_len || sent < total) events |= POLLOUT;
            client_at = n;
            fds[n++] = (struct pollfd){.fd = client->fd, .events = events};
        }
        int pending_at = n;
        for (int i = 0; i < PENDING; i++)
            if (pending[i]) fds[n++] = (struct pollfd){.fd = pending[i]->fd, .events = POLLIN};
        int timeout = 1000;
        if (ended && !pty_eof) timeout = QUIET_MS;
        if (kill_at_ms) timeout = 20;
        if (poll(fds, (nfds_t)n, timeout) < 0 && errno != EINTR) return 1;
        now = now_ms();

        if (fds[0].revents) reap();
        if (master_at >= 0 && fds[master_at].revents) {
            if (fds[master_at].revents & POLLOUT) write_input();
            if (fds[master_at].revents & (POLLIN | POLLHUP | POLLERR)) read_pty();
        }
        if (client_at >= 0 && client && fds[client_at].revents) {
            if (fds[client_at].revents & (POLLIN | POLLHUP | POLLERR)) {
                if (!receive(client) || process(client, 1) == 0) { drop(client); client = NULL; }
            }
        }
        /* pending connections: the attach, or a timeout */
        int k = pending_at;
        for (int i = 0; i < PENDING; i++) {
            if (!pending[i]) continue;
            struct conn *c = pending[i];
            int ready = fds[k++].revents;
            if (ready) {
                pending[i] = NULL;
                int r = receive(c) ? process(c, 0) : 0;
                if (r == 2) continue;              /* attached: it is the client now */
                if (r == 1) { pending[i] = c; }    /* not all there yet */
                else if (r == 0) drop(c);          /* r == -1: refused and dropped already */
            }
            if (pending[i] && now - pending[i]->since_ms > AUTH_MS) {
                refuse(pending[i], "refused: no attach in time");
                pending[i] = NULL;
            }
        }
        /* Every waiting connection is taken at once; with no slot free the oldest unauthenticated one goes,
           so a flood of strangers can delay a real client's attach but never lock it out. */
        while (fds[1].revents & POLLIN) {
            int fd = accept4(listener, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd < 0) break;
            int slot = 0;
            for (int i = 0; i < PENDING; i++) {
                if (!pending[i]) { slot = i; break; }
                if (pending[i]->since_ms < pending[slot]->since_ms) slot = i;
            }
            if (pending[slot]) { drop(pending[slot]); pending[slot] = NULL; }
            struct conn *c = calloc(1, sizeof *c);
            if (!c) { close(fd); break; }
            c->fd = fd;
            c->since_ms = now;
            pending[slot] = c;
        }
    }
}

/* --- starting ------------------------------------------------------------------------------------- */

/* Whatever the starter was handed besides stdin, stdout and stderr (a parent's pipes or sockets left without
   close-on-exec: uvloop's subprocesses inherit its stdio socketpairs that way) is not the holder's. Kept, it would
   hold the starter's stdout open for as long as the holder lives, so its parent never read an end, and it would
   reach the program. Closed here, all but `keep`, scanning /proc/self/fd until a pass finds nothing. */
static void close_inherited(int keep) {
    for (int closed = 1; closed;) {
        closed = 0;
        DIR *d = opendir("/proc/self/fd");
        if (!d) return;
        int fds[256], count = 0;
        struct dirent *e;
        while ((e = readdir(d)) && count < 256) {
            int fd = atoi(e->d_name);
            if (e->d_name[0] != '.' && fd > 2 && fd != keep && fd != dirfd(d)) fds[count++] = fd;
        }
        closedir(d);
        for (int k = 0; k < count; k++) closed += close(fds[k]) == 0;
    }
}

static void fail(int fd, const char *format, ...) {
    char text[512];
    va_list args;
    va_start(args, format);
    int n = vsnprintf(text, sizeof text, format, args);
    va_end(args);
    if (fd >= 0 && n > 0) { ssize_t ignored = write(fd, text, (size_t)n); (void)ignored; }
    _exit(1);
}

/* /proc/PID/stat from its third field on (the state: "S 1 ..."), in stat; NULL when there is no such process. */
static char *stat_of(pid_t pid, char *stat, size_t size) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    ssize_t n = read(fd, stat, size - 1);
    close(fd);
    if (n <= 0) return NULL;
    stat[n] = 0;
    char *p = strrchr(stat, ')');  /* after the command's name, which may hold anything */
    return p && p[1] == ' ' ? p + 2 : NULL;
}

static unsigned long long start_time_of(pid_t pid) {
    char stat[1024];
    char *p = stat_of(pid, stat, sizeof stat);
    for (int field = 3; field < 22 && p; field++) { p = strchr(p, ' '); if (p) p++; }
    return p ? strtoull(p, NULL, 10) : 0;
}

/* The one-letter state of /proc/PID/stat ('R', 'S', 'Z', ...), or 0 when there is no such process. */
static char state_of(pid_t pid) {
    char stat[1024];
    char *p = stat_of(pid, stat, sizeof stat);
    return p ? *p : 0;
}

/* The starter with --reap: the holder and whatever is orphaned below it become its children (it is a
   subreaper), and it reaps them until none is left. A container's PID 1 that reaps nothing (`sleep`) would
   otherwise keep each of them as a zombie: one for every session, more for killed trees. */
static int reap_all(void) {
    signal(SIGHUP, SIG_IGN);
    signal(SIGPIPE, SIG_IGN);
    int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (devnull >= 0) { dup2(devnull, 0); dup2(devnull, 1); dup2(devnull, 2); }
    for (;;) {
        pid_t pid = waitpid(-1, NULL, 0);
        if (pid < 0 && errno == ECHILD) return 0;
    }
}

static int serve(int argc, char **argv) {
    const char *cwd = NULL;
    int reap = 0;
    char *setenvs[16];
    int setenv_count = 0;
    unsigned cols = 80, rows = 24;
    int i = 0;
    dir = argv[i++];
    for (; i < argc; i++) {
        if (!strcmp(argv[i], "--")) { i++; break; }
        if (!strcmp(argv[i], "--reap")) { reap = 1; continue; }
        if (i + 1 >= argc) { fprintf(stderr, "error %s needs a value\n", argv[i]); return 2; }
        if (!strcmp(argv[i], "--ring")) ring_size = strtoul(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--cols")) cols = (unsigned)strtoul(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--rows")) rows = (unsigned)strtoul(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--linger")) linger_s = strtol(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--cwd")) cwd = argv[++i];
        else if (!strcmp(argv[i], "--setenv")) {
            if (setenv_count == 16 || !strchr(argv[i + 1], '=')) { printf("error bad --setenv\n"); return 1; }
            setenvs[setenv_count++] = argv[++i];
        }
        else { fprintf(stderr, "error unknown option %s\n", argv[i]); return 2; }
    }
    if (i >= argc) { printf("error no program given\n"); return 1; }
    if (ring_size < 4096 || ring_size > (256u << 20)) { printf("error --ring must be 4 KiB to 256 MiB\n"); return 1; }
    if (cols < 1 || cols > 1000 || rows < 1 || rows > 1000) { printf("error bad grid\n"); return 1; }
    char **program_argv = argv + i;

    /* the secret: one line on stdin */
    size_t got = 0;
    while (got < MAX_SECRET) {
        ssize_t n = read(0, secret + got, 1);
        if (n <= 0 || secret[got] == '\n') break;
        got++;
    }
    secret[got] = 0;
    secret_len = got;
    if (secret_len < 16) { printf("error a secret of at least 16 characters must come on stdin\n"); return 1; }

    if (mkdir(dir, 0700) != 0 && errno != EEXIST) { printf("error cannot make %s: %s\n", dir, strerror(errno)); return 1; }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid() || (st.st_mode & 077)) {
        printf("error %s must be a directory of this user's that only it can reach\n", dir);
        return 1;
    }
    char sock_path[4096];
    path_in(sock_path, sizeof sock_path, "sock");
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(sock_path) >= sizeof addr.sun_path) { printf("error the path %s is too long for a socket\n", sock_path); return 1; }
    strcpy(addr.sun_path, sock_path);
    char probe[4096];
    path_in(probe, sizeof probe, "exit");
    if (access(probe, F_OK) == 0) { printf("error %s holds an ended session already\n", dir); return 1; }

    int ready[2];
    if (pipe2(ready, O_CLOEXEC) != 0) { printf("error pipe: %s\n", strerror(errno)); return 1; }
    /* With --reap, the holder (orphaned when the first child goes) becomes ours to reap. */
    if (reap && prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) { printf("error cannot be a subreaper: %s\n", strerror(errno)); return 1; }
    fflush(stdout);
    pid_t first = fork();
    if (first < 0) { printf("error fork: %s\n", strerror(errno)); return 1; }
    if (first > 0) {
        /* the starter: report what the holder says, then go (the holder is not our child for long) */
        close(ready[1]);
        char text[512];
        ssize_t n, at = 0;
        while (at < (ssize_t)sizeof text - 1 && (n = read(ready[0], text + at, sizeof text - 1 - at)) > 0) at += n;
        text[at] = 0;
        waitpid(first, NULL, 0);
        if (at == 0) { printf("error the holder ended before it was ready\n"); return 1; }
        fputs(text, stdout);
        int started = strncmp(text, "holder ", 7) == 0;
        fflush(stdout);
        if (started && reap) return reap_all();
        return started ? 0 : 1;
    }
    /* the first child: a new session, then the holder is its child, so no terminal can hang it up */
    close(ready[0]);
    if (setsid() < 0) fail(ready[1], "error setsid: %s\n", strerror(errno));
    pid_t holder = fork();
    if (holder < 0) fail(ready[1], "error fork: %s\n", strerror(errno));
    if (holder > 0) _exit(0);

    signal(SIGHUP, SIG_IGN);
    signal(SIGPIPE, SIG_IGN);
    int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (devnull >= 0) { dup2(devnull, 0); dup2(devnull, 1); dup2(devnull, 2); }
    close_inherited(ready[1]);

    ring = malloc(ring_size);
    if (!ring) fail(ready[1], "error no memory for a ring of %zu bytes\n", ring_size);
    master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (master < 0 || grantpt(master) || unlockpt(master)) fail(ready[1], "error no PTY: %s\n", strerror(errno));
    char *slave_name = ptsname(master);
    if (!slave_name) fail(ready[1], "error no PTY name\n");
    struct winsize size = {.ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols};
    ioctl(master, TIOCSWINSZ, &size);

    unlink(sock_path);
    listener = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    mode_t old_mask = umask(0177);
    if (listener < 0 || bind(listener, (struct sockaddr *)&addr, sizeof addr) || listen(listener, 64))
        fail(ready[1], "error cannot listen on %s: %s\n", sock_path, strerror(errno));
    umask(old_mask);

    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    sigfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    if (sigfd < 0) fail(ready[1], "error signalfd: %s\n", strerror(errno));

    /* Orphans of the program's tree become the holder's children, not init's: ending the tree then finds
       all of it below the holder (signal_tree), and the holder reaps them. */
    subreaper = prctl(PR_SET_CHILD_SUBREAPER, 1) == 0;

    int exec_report[2];
    if (pipe2(exec_report, O_CLOEXEC) != 0) fail(ready[1], "error pipe: %s\n", strerror(errno));
    program = fork();
    if (program < 0) fail(ready[1], "error fork: %s\n", strerror(errno));
    if (program == 0) {
        /* Every signal as a terminal's program has it: none blocked, none ignored. Whoever started the worker
           may have ignored some (a job started with `&` by a script ignores SIGINT and SIGQUIT), and an ignored
           signal outlives exec: Ctrl-C would reach nothing the shell starts. */
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        for (int sig = 1; sig < NSIG; sig++) if (sig != SIGKILL && sig != SIGSTOP) signal(sig, SIG_DFL);
        setsid();
        int slave = open(slave_name, O_RDWR);
        if (slave < 0) { int e = errno; ssize_t w = write(exec_report[1], &e, sizeof e); (void)w; _exit(127); }
        ioctl(slave, TIOCSCTTY, 0);
        dup2(slave, 0); dup2(slave, 1); dup2(slave, 2);
        if (slave > 2) close(slave);
        for (int e = 0; e < setenv_count; e++) putenv(setenvs[e]);
        if (cwd && chdir(cwd) != 0) { int e = errno; ssize_t w = write(exec_report[1], &e, sizeof e); (void)w; _exit(127); }
        execvp(program_argv[0], program_argv);
        int e = errno;
        ssize_t w = write(exec_report[1], &e, sizeof e);
        (void)w;
        _exit(127);
    }
    close(exec_report[1]);
    int exec_errno = 0;
    if (read(exec_report[0], &exec_errno, sizeof exec_errno) == sizeof exec_errno) {
        waitpid(program, NULL, 0);
        unlink(sock_path);
        fail(ready[1], "error could not start %s: %s\n", program_argv[0], strerror(exec_errno));
    }
    close(exec_report[0]);
    set_nonblocking(master);

    char holder_path[4096], text[128];
    path_in(holder_path, sizeof holder_path, "holder");
    int n = snprintf(text, sizeof text, "holder %d %llu program %d %llu%s\n", (int)getpid(), start_time_of(getpid()),
                     (int)program, start_time_of(program), subreaper ? " subreaper" : "");
    int fd = open(holder_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd >= 0) { ssize_t w = write(fd, text, (size_t)n); (void)w; close(fd); }
    ssize_t w = write(ready[1], text, (size_t)n);
    (void)w;
    close(ready[1]);

    last_output_ms = now_ms();
    int rc = serve_loop();
    cleanup_files();
    _exit(rc);
}

/* --- attach: a relay for `docker exec -i` ------------------------------------------------------ */

/* One direction of the relay: what was read and is not yet written on. */
struct pipe_buf { unsigned char at[CHUNK]; size_t len, pos; };

/* Writes what `b` holds to `to` without blocking; 0 when `to` has gone. */
static int pass_on(struct pipe_buf *b, int to) {
    while (b->pos < b->len) {
        ssize_t m = write(to, b->at + b->pos, b->len - b->pos);
        if (m > 0) { b->pos += (size_t)m; continue; }
        if (m < 0 && errno == EINTR) continue;
        return m < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    }
    b->len = b->pos = 0;
    return 1;
}

/* Each direction has its own buffer and waits only for its own reader: a worker that stops reading output
   (its viewers are behind) still reaches the holder with input, acknowledgements and Kill. One buffer for
   both once did not: the relay sat in a write to a full stdout, and a Kill sent meanwhile never arrived. */
static int relay(int argc, char **argv) {
    if (argc < 1) return 2;
    dir = argv[0];
    signal(SIGPIPE, SIG_IGN);
    char sock_path[4096];
    path_in(sock_path, sizeof sock_path, "sock");
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(sock_path) >= sizeof addr.sun_path) return 1;
    strcpy(addr.sun_path, sock_path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        fprintf(stderr, "no holder listens at %s: %s\n", sock_path, strerror(errno));
        return 1;
    }
    int ends[3] = {0, 1, fd};
    for (int i = 0; i < 3; i++) fcntl(ends[i], F_SETFL, fcntl(ends[i], F_GETFL) | O_NONBLOCK);
    static struct pipe_buf up, down;  /* stdin to the holder; the holder to stdout */
    int stdin_open = 1, hung_up = 0;  /* hung_up: the holder's end went (what it sent is still passed on) */
    for (;;) {
        struct pollfd fds[3] = {
            {.fd = stdin_open && !up.len ? 0 : -1, .events = POLLIN},
            /* not polled while its last output waits for stdout: a hung-up socket polls ready at once */
            {.fd = hung_up && down.len ? -1 : fd, .events = (short)((down.len ? 0 : POLLIN) | (up.len ? POLLOUT : 0))},
            {.fd = down.len ? 1 : -1, .events = POLLOUT},
        };
        if (poll(fds, 3, -1) < 0) { if (errno == EINTR) continue; return 1; }
        if (fds[0].revents) {
            ssize_t n = read(0, up.at, sizeof up.at);
            if (n > 0) up.len = (size_t)n, up.pos = 0;
            else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
                stdin_open = 0;  /* nothing of it is left to pass on: stdin is read only when `up` is empty */
                shutdown(fd, SHUT_WR);
            }
        }
        if (fds[1].revents & (POLLHUP | POLLERR)) hung_up = 1;
        if (!pass_on(&up, fd)) return 0;
        if (!down.len && (fds[1].revents & (POLLIN | POLLHUP | POLLERR))) {
            ssize_t n = read(fd, down.at, sizeof down.at);
            if (n == 0) return 0;
            if (n > 0) down.len = (size_t)n, down.pos = 0;
            else if (errno != EAGAIN && errno != EINTR) return 0;
        }
        if (!pass_on(&down, 1)) return 0;
    }
}

/* DIR/holder's line into text (empty when there is none): -1 no file, 1 its holder still runs, 0 it does not. */
static int holder_state(char *text, size_t size) {
    char path[4096];
    path_in(path, sizeof path, "holder");
    text[0] = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t m = read(fd, text, size - 1);
    close(fd);
    text[m > 0 ? m : 0] = 0;
    int pid = 0;
    unsigned long long started = 0;
    if (sscanf(text, "holder %d %llu", &pid, &started) != 2 || pid <= 0 || start_time_of(pid) != started) return 0;
    char state = state_of(pid);
    return state != 'Z' && state != 'X';  /* killed, and not reaped (a PID 1 that reaps nothing): not alive */
}

/* "exit" with the record once the program has ended (and "held=1" while its holder still lives, keeping the
   last output for a client); "running holder ..." while its holder is alive (the pid's start time still
   matches, and it is no zombie); "gone" when the holder is not; "none" when nothing was started here. */
static int status(int argc, char **argv) {
    if (argc < 1) return 2;
    dir = argv[0];
    char text[256], holder_text[256];
    size_t n = exit_text(text, sizeof text);
    if (n) {
        fputs("exit ", stdout);
        fwrite(text, 1, n, stdout);
        if (holder_state(holder_text, sizeof holder_text) > 0) printf("held=1\n");
        return 0;
    }
    int state = holder_state(text, sizeof text);
    if (state < 0) { printf("none\n"); return 0; }
    if (state) {
        printf("running %s", text);
    } else {
        /* it may have ended between our two reads: its record then exists */
        n = exit_text(text, sizeof text);
        if (n) { fputs("exit ", stdout); fwrite(text, 1, n, stdout); }
        else printf("gone\n");
    }
    return 0;
}

/* The end is on record elsewhere: the directory goes, once no holder lives in it. */
static int forget(int argc, char **argv) {
    if (argc < 1) return 2;
    dir = argv[0];
    char path[4096], text[256];
    int state = holder_state(text, sizeof text);
    if (state > 0) {
        printf("error the holder still runs\n");
        return 1;
    }
    if (state == 0) {
        path_in(path, sizeof path, "holder");
        unlink(path);
    }
    const char *names[] = {"exit", "exit.tmp", "sock"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) { path_in(path, sizeof path, names[i]); unlink(path); }
    if (rmdir(dir) != 0 && errno != ENOENT) { printf("error %s: %s\n", dir, strerror(errno)); return 1; }
    return 0;
}

/* --- mux: a program on pipes, spoken over the terminal it was given --------------------------------- */
/* `tether-holder mux [--] ARGV...` runs ARGV with its stdin, stdout and stderr on pipes, with no terminal
   of its own (a new session), and speaks for it over its own stdin/stdout (the PTY a shell would have had,
   put in raw mode) in lines of ASCII that survive any terminal, raw or cooked:
     out:  "O<out>,<err>,<n>:<base64>\n" (stdout) or "E<out>,<err>,<n>:<base64>\n" (stderr): <out> and <err>
           count the bytes of each stream before this piece of <n> bytes, so any whole line says where it is in
           both streams (and a line cut short, or a screen's redraw of one, is told from a whole one);
     in:   "D<base64>\n" bytes for the program's stdin, "C\n" closes it (EOF); "\r" ends a line as well
           (tmux types Enter as CR), and any other line is ignored (an echo before raw mode took hold).
   It exits as the program did (re-raising the signal that ended it), once both pipes are closed, or have
   stayed quiet for QUIET_MS after the program's end (a background child may hold them open for ever), or
   MUX_DRAIN_MS after it (one may write for ever), and leaves its terminal's modes as it found them.
   HUP, INT, TERM and QUIT sent to it are passed to the program's process group. A program that cannot be
   started is said in a line "N<base64 of why>", and the mux exits 127 (126: found, not executable). */
#define MUX_PIECE 3072                 /* bytes of output a line: 4096 characters of base64 */
#define MUX_LINE (96 * 1024)           /* the longest input line taken; a longer one is dropped whole */
#define MUX_STDIN_HIGH (64 * 1024)     /* stdin bytes waiting for the program: above this, input waits */
#define MUX_DRAIN_MS 1000              /* after the program's end, its pipes are read at most this long */

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static size_t b64_encode(const unsigned char *in, size_t n, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16;
        if (i + 1 < n) v |= (uint32_t)in[i + 1] << 8;
        if (i + 2 < n) v |= in[i + 2];
        out[o++] = B64[(v >> 18) & 63];
        out[o++] = B64[(v >> 12) & 63];
        out[o++] = i + 1 < n ? B64[(v >> 6) & 63] : '=';
        out[o++] = i + 2 < n ? B64[v & 63] : '=';
    }
    return o;
}

static int b64_value(int c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* Decodes n characters (a multiple of 4, '=' only at the end) into out; -1 when it is not base64. */
static long b64_decode(const char *in, size_t n, unsigned char *out) {
    if (n % 4) return -1;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        for (int k = 0; k < 4; k++) {
            v[k] = in[i + k] == '=' && i + 4 == n && k >= 2 ? 0 : b64_value((unsigned char)in[i + k]);
            if (v[k] < 0) return -1;
        }
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        out[o++] = (unsigned char)(w >> 16);
        if (in[i + 2] != '=') out[o++] = (unsigned char)(w >> 8);
        if (in[i + 3] != '=') out[o++] = (unsigned char)w;
        if (in[i + 2] == '=' && in[i + 3] != '=') return -1;
    }
    return (long)o;
}

static int write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && errno == EAGAIN) { struct pollfd f = {fd, POLLOUT, 0}; poll(&f, 1, 1000); continue; }
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static uint64_t mux_counts[2];  /* bytes of stdout, stderr said so far */
static int mux_out_gone;        /* our stdout (the terminal) is gone: what the program prints is dropped */

/* Reads what one pipe has (one piece) and says it: 1 when it did, 0 at the pipe's end, -1 when it has
   nothing now. */
static int mux_pipe(int fd, int which) {
    unsigned char piece[MUX_PIECE];
    ssize_t n = read(fd, piece, sizeof piece);
    if (n < 0) return errno == EAGAIN || errno == EINTR ? -1 : 0;
    if (n == 0) return 0;
    char line[80 + MUX_PIECE / 3 * 4 + 8];
    int head = snprintf(line, 80, "%c%llu,%llu,%zd:", which ? 'E' : 'O', (unsigned long long)mux_counts[0],
                        (unsigned long long)mux_counts[1], n);
    size_t len = (size_t)head + b64_encode(piece, (size_t)n, line + head);
    line[len++] = '\n';
    mux_counts[which] += (uint64_t)n;
    if (!mux_out_gone && write_all(1, line, len) != 0) mux_out_gone = 1;
    return 1;
}

static int mux(int argc, char **argv) {
    if (argc > 0 && !strcmp(argv[0], "--")) { argc--; argv++; }
    if (argc < 1) { fprintf(stderr, "usage: tether-holder mux [--] ARGV...\n"); return 2; }
    struct termios raw, saved;
    int is_tty = isatty(0) && tcgetattr(0, &saved) == 0;
    if (is_tty) { raw = saved; cfmakeraw(&raw); tcsetattr(0, TCSANOW, &raw); }
    int in[2], out[2], err[2], started[2];
    if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC) || pipe2(started, O_CLOEXEC)) {
        perror("pipe");
        return 126;
    }
    sigset_t mask, old;
    sigemptyset(&mask);
    int passed[] = {SIGHUP, SIGINT, SIGTERM, SIGQUIT};
    sigaddset(&mask, SIGCHLD);
    for (size_t i = 0; i < sizeof passed / sizeof *passed; i++) sigaddset(&mask, passed[i]);
    sigprocmask(SIG_BLOCK, &mask, &old);
    pid_t child = fork();
    if (child < 0) { perror("fork"); return 126; }
    if (child == 0) {
        setsid();  /* no controlling terminal: a program that opens /dev/tty is told there is none */
        dup2(in[0], 0);
        dup2(out[1], 1);
        dup2(err[1], 2);
        /* As for a held program: no signal ignored or blocked (an interrupt must reach it). */
        for (int sig = 1; sig < NSIG; sig++) if (sig != SIGKILL && sig != SIGSTOP) signal(sig, SIG_DFL);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        execvp(argv[0], argv);
        int e = errno;  /* told to the mux: the program did not start (an exec that works closes the pipe) */
        if (write(started[1], &e, sizeof e) != sizeof e) {}
        _exit(e == ENOENT ? 127 : 126);
    }
    close(in[0]);
    close(out[1]);
    close(err[1]);
    close(started[1]);
    int exec_errno = 0;
    ssize_t told;
    while ((told = read(started[0], &exec_errno, sizeof exec_errno)) < 0 && errno == EINTR) {}
    close(started[0]);
    if (told == sizeof exec_errno) {
        /* "N<base64 of why>": the program never ran (Tether records that it did not start, not an exit). */
        char why[512], line[8 + sizeof why / 3 * 4 + 8];
        int n = snprintf(why, sizeof why, "could not start %s: %s", argv[0], strerror(exec_errno));
        if (n < 0) n = 0;
        if ((size_t)n >= sizeof why) n = sizeof why - 1;
        line[0] = 'N';
        size_t len = 1 + b64_encode((const unsigned char *)why, (size_t)n, line + 1);
        line[len++] = '\n';
        if (write_all(1, line, len) != 0) {}
    }
    signal(SIGPIPE, SIG_IGN);
    int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    int fds[2] = {out[0], err[0]};
    set_nonblocking(out[0]);
    set_nonblocking(err[0]);
    set_nonblocking(in[1]);
    /* Not our terminal's: O_NONBLOCK is shared with whoever else has it open (a tmux pane's shim writes its
       end after us). A raw terminal's read after poll() said readable does not block. */
    int stdin_fd = in[1], stdin_close = 0, term_in = 1;
    static unsigned char pending[MUX_STDIN_HIGH + MUX_LINE];
    static char line[MUX_LINE];
    size_t pending_len = 0, line_len = 0;
    int line_dropped = 0, reaped = 0, status = 0;
    long long quiet_since = now_ms(), reaped_ms = 0;
    for (;;) {
        if (!reaped && waitpid(child, &status, WNOHANG) == child) { reaped = 1; reaped_ms = quiet_since = now_ms(); }
        /* The end: both pipes closed, or quiet a while, or a background child still writing after MUX_DRAIN_MS. */
        if (reaped && ((fds[0] < 0 && fds[1] < 0) || now_ms() - quiet_since >= QUIET_MS
                       || now_ms() - reaped_ms >= MUX_DRAIN_MS)) break;
        struct pollfd p[5];
        int np = 0, at_out = -1, at_err = -1, at_term = -1;
        p[np++] = (struct pollfd){sfd, POLLIN, 0};
        if (fds[0] >= 0) { at_out = np; p[np++] = (struct pollfd){fds[0], POLLIN, 0}; }
        if (fds[1] >= 0) { at_err = np; p[np++] = (struct pollfd){fds[1], POLLIN, 0}; }
        if (term_in && pending_len <= MUX_STDIN_HIGH) { at_term = np; p[np++] = (struct pollfd){0, POLLIN, 0}; }
        if (stdin_fd >= 0 && pending_len > 0) p[np++] = (struct pollfd){stdin_fd, POLLOUT, 0};
        /* Without a signalfd, the child's end is looked for every 100 ms. */
        int timeout = reaped ? (int)(QUIET_MS - (now_ms() - quiet_since)) : (sfd < 0 ? 100 : -1);
        if (reaped && timeout < 1) timeout = 1;
        if (poll(p, (nfds_t)np, timeout) < 0) {
            if (errno == EINTR) continue;
            if (!reaped && waitpid(child, &status, 0) == child) reaped = 1;  /* cannot wait on the pipes: its end */
            break;
        }
        if (p[0].revents) {
            struct signalfd_siginfo info;
            while (read(sfd, &info, sizeof info) == sizeof info) {
                /* To its process group (it leads one: setsid), or to it alone before it got there. */
                if (info.ssi_signo != SIGCHLD && kill(-child, (int)info.ssi_signo) != 0 && errno == ESRCH)
                    kill(child, (int)info.ssi_signo);
            }
        }
        int at[2] = {at_out, at_err};
        for (int k = 0; k < 2; k++) {
            if (at[k] < 0 || !p[at[k]].revents) continue;
            if (mux_pipe(fds[k], k) == 0) { close(fds[k]); fds[k] = -1; }
            quiet_since = now_ms();
        }
        if (at_term >= 0 && p[at_term].revents) {
            char buf[16384];
            ssize_t n = read(0, buf, sizeof buf);
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) term_in = 0;
            for (ssize_t i = 0; i < n; i++) {
                char c = buf[i];
                if (c != '\n' && c != '\r') {
                    if (line_len < sizeof line) line[line_len++] = c; else line_dropped = 1;
                    continue;
                }
                if (!line_dropped && line_len > 0 && line[0] == 'D' && stdin_fd >= 0 && !stdin_close) {
                    long got = b64_decode(line + 1, line_len - 1, pending + pending_len);
                    if (got > 0) pending_len += (size_t)got;
                } else if (!line_dropped && line_len == 1 && line[0] == 'C') {
                    stdin_close = 1;
                }
                line_len = 0;
                line_dropped = 0;
            }
            /* Read only while at most MUX_STDIN_HIGH waits: one read adds at most the line carried over and
               what this buffer holds, which pending has room for. */
        }
        if (stdin_fd >= 0 && pending_len > 0) {
            ssize_t w = write(stdin_fd, pending, pending_len);
            if (w > 0) { memmove(pending, pending + w, pending_len - (size_t)w); pending_len -= (size_t)w; }
            else if (w < 0 && errno != EAGAIN && errno != EINTR) { pending_len = 0; close(stdin_fd); stdin_fd = -1; }
        }
        if (stdin_fd >= 0 && stdin_close && pending_len == 0) { close(stdin_fd); stdin_fd = -1; }
    }
    for (int k = 0; k < 2; k++)  /* what the pipes hold now (a bounded read: a writer may never stop) */
        for (int n = 0; fds[k] >= 0 && n < 64 && mux_pipe(fds[k], k) > 0; n++) {}
    if (is_tty) tcsetattr(0, TCSANOW, &saved);  /* the terminal as it was given */
    if (!reaped) return 1;  /* cannot be: the loop ends only after the end, or once poll fails and waitpid too */
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        struct rlimit none = {0, 0};
        setrlimit(RLIMIT_CORE, &none);
        signal(sig, SIG_DFL);
        sigset_t all;
        sigfillset(&all);
        sigprocmask(SIG_UNBLOCK, &all, NULL);
        kill(getpid(), sig);
        return 128 + sig;
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

int main(int argc, char **argv) {
    if (argc >= 3 && !strcmp(argv[1], "serve")) return serve(argc - 2, argv + 2);
    if (argc >= 3 && !strcmp(argv[1], "attach")) return relay(argc - 2, argv + 2);
    if (argc >= 3 && !strcmp(argv[1], "status")) return status(argc - 2, argv + 2);
    if (argc >= 3 && !strcmp(argv[1], "forget")) return forget(argc - 2, argv + 2);
    if (argc >= 3 && !strcmp(argv[1], "mux")) return mux(argc - 2, argv + 2);
    /* The version, then what this holder does that the first did not (a worker asks before it uses them). */
    if (argc >= 2 && !strcmp(argv[1], "version")) { printf("tether-holder 2 screens\n"); return 0; }
    fprintf(stderr, "usage: tether-holder serve DIR [options] -- ARGV... | attach DIR | status DIR | forget DIR | mux -- ARGV... | version\n");
    return 2;
}
