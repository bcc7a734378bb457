/*
 * echo - a TCP echo server for roam's socket layer (a service workload).
 *
 * Why this exists: it is the smallest program that uses every socket call a
 * server needs (accept, recv, send, shutdown, poll, non-blocking fds), so
 * the OS layer's socket semantics and the checkpointing of a server blocked
 * in accept, recv or poll can be tested with real clients.
 *
 * The listening socket is inherited: the first fd from 3 on that is a
 * socket (`roam run --listen ADDR` hands it over after the preopened
 * directories, as wasmtime's --tcplisten does).
 *
 * Modes:
 *   echo poll [N]    one poll() loop over the listener and every client,
 *                    non-blocking fds, partial sends buffered per client
 *   echo serial [N]  one client at a time with blocking accept, recv, send
 * With N, the server exits 0 after N clients have gone. It prints one line
 * per event on stdout: accepted, closed (client EOF) or reset, with the
 * byte count echoed.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

enum { MAX_CLIENTS = 64, BUF = 16384 };

static int find_listener(void) {
    for (int fd = 3; fd < 1024; fd++) {
        struct stat st;
        if (fstat(fd, &st) != 0) {
            if (errno == EBADF) break;
            continue;
        }
        if (S_ISSOCK(st.st_mode)) return fd;
    }
    return -1;
}

static void event(const char *what, int id, unsigned long long bytes) {
    printf("echo: client %d %s after %llu bytes\n", id, what, bytes);
    fflush(stdout);
}

/* ---- serial mode: blocking calls only --------------------------------- */

static int serve_serial(int lfd, long limit) {
    for (int id = 1; limit < 0 || id <= limit; id++) {
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0) {
            fprintf(stderr, "echo: accept: %s\n", strerror(errno));
            return 1;
        }
        printf("echo: client %d accepted\n", id);
        fflush(stdout);
        unsigned long long total = 0;
        char buf[BUF];
        for (;;) {
            ssize_t n = recv(fd, buf, sizeof buf, 0);
            if (n == 0) {
                event("closed", id, total);
                break;
            }
            if (n < 0) {
                event(errno == ECONNRESET ? "reset" : strerror(errno), id, total);
                break;
            }
            for (ssize_t off = 0; off < n;) {
                ssize_t w = send(fd, buf + off, (size_t)(n - off), 0);
                if (w < 0) {
                    event(errno == ECONNRESET ? "reset" : strerror(errno), id, total);
                    goto done;
                }
                off += w;
            }
            total += (unsigned long long)n;
        }
    done:
        close(fd);
    }
    return 0;
}

/* ---- poll mode: one event loop ---------------------------------------- */

typedef struct {
    int fd, id;
    char out[BUF];
    size_t out_len;
    int eof;
    unsigned long long total;
} client;

static client clients[MAX_CLIENTS];
static int nclients;

static void drop(int i, const char *why) {
    event(why, clients[i].id, clients[i].total);
    close(clients[i].fd);
    clients[i] = clients[--nclients];
}

static int serve_poll(int lfd, long limit) {
    if (fcntl(lfd, F_SETFL, fcntl(lfd, F_GETFL) | O_NONBLOCK) != 0) {
        fprintf(stderr, "echo: cannot make the listener non-blocking: %s\n", strerror(errno));
        return 1;
    }
    int next_id = 1;
    long gone = 0;
    struct pollfd p[MAX_CLIENTS + 1];
    while (limit < 0 || gone < limit) {
        p[0] = (struct pollfd){.fd = lfd, .events = nclients < MAX_CLIENTS ? POLLIN : 0};
        for (int i = 0; i < nclients; i++) {
            short ev = 0;
            if (!clients[i].eof && clients[i].out_len == 0) ev |= POLLIN;
            if (clients[i].out_len > 0) ev |= POLLOUT;
            p[i + 1] = (struct pollfd){.fd = clients[i].fd, .events = ev};
        }
        int n = nclients;
        if (poll(p, (nfds_t)n + 1, -1) < 0) {
            fprintf(stderr, "echo: poll: %s\n", strerror(errno));
            return 1;
        }
        /* Walk clients backwards: drop() moves the last one into slot i. */
        for (int i = n - 1; i >= 0; i--) {
            client *c = &clients[i];
            short re = p[i + 1].revents;
            if (re & POLLOUT) {
                ssize_t w = send(c->fd, c->out, c->out_len, 0);
                if (w < 0 && errno != EAGAIN) {
                    drop(i, errno == ECONNRESET ? "reset" : strerror(errno));
                    gone++;
                    continue;
                }
                if (w > 0) {
                    memmove(c->out, c->out + w, c->out_len - (size_t)w);
                    c->out_len -= (size_t)w;
                }
            }
            if (re & (POLLIN | POLLHUP | POLLERR) && c->out_len == 0 && !c->eof) {
                ssize_t r = recv(c->fd, c->out, sizeof c->out, 0);
                if (r < 0 && errno != EAGAIN) {
                    drop(i, errno == ECONNRESET ? "reset" : strerror(errno));
                    gone++;
                    continue;
                }
                if (r == 0) c->eof = 1;
                if (r > 0) c->out_len = (size_t)r, c->total += (unsigned long long)r;
            }
            if (c->eof && c->out_len == 0) {
                drop(i, "closed");
                gone++;
            }
        }
        if (p[0].revents & POLLIN) {
            for (;;) {
                int fd = accept(lfd, NULL, NULL);
                if (fd < 0) {
                    if (errno != EAGAIN) fprintf(stderr, "echo: accept: %s\n", strerror(errno));
                    break;
                }
                if (nclients == MAX_CLIENTS) {
                    close(fd);
                    break;
                }
                fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
                clients[nclients] = (client){.fd = fd, .id = next_id++};
                printf("echo: client %d accepted\n", clients[nclients].id);
                fflush(stdout);
                nclients++;
            }
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "poll";
    long limit = argc > 2 ? strtol(argv[2], NULL, 10) : -1;
    if ((strcmp(mode, "poll") != 0 && strcmp(mode, "serial") != 0) || argc > 3 || limit == 0) {
        fprintf(stderr, "usage: echo [poll|serial] [CLIENTS]\n");
        return 2;
    }
    int lfd = find_listener();
    if (lfd < 0) {
        fprintf(stderr, "echo: no listening socket among the inherited fds; "
                        "run it with 'roam run --listen ADDR'\n");
        return 2;
    }
    printf("echo: serving on fd %d (%s)\n", lfd, mode);
    fflush(stdout);
    return strcmp(mode, "poll") == 0 ? serve_poll(lfd, limit) : serve_serial(lfd, limit);
}
