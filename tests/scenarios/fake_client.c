/* The client behind every fake tool of a scenario world (tests/scenarios/fake_server.py).
 *
 * A fake tool is a script whose first line is "#!<this client> <socket>|<world.json>", so the
 * kernel runs this program as  client "<socket>|<world.json>" <script> <args...>. It hands its
 * argv, pid, parent pid, stdout and stderr (SCM_RIGHTS) to the test process's fake-tool server,
 * which answers the call as fake_tool.py says, writing to those descriptors, and replies
 *   "E <rc> <keep_output_s>\n"  exit with rc (after leaving a child that holds stdout and
 *                               stderr open keep_output_s seconds when that is above 0), or
 *   "K\n"                       die of the signal this client forwarded ("S<signum>\n").
 * SIGTERM and SIGINT are forwarded, so the server logs them and applies no effect, as a
 * Python fake did when it was signalled; SIGKILL closes the socket and the server stops too.
 * Exit 125 with a line on stderr: the server could not be reached or ended without an answer.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define HARNESS_RC 125

static int server = -1;
static volatile sig_atomic_t pending;

static void die_of(int signum)
{
    sigset_t set;

    signal(signum, SIG_DFL);
    sigemptyset(&set);
    sigaddset(&set, signum);
    sigprocmask(SIG_UNBLOCK, &set, NULL);
    raise(signum);
    _exit(128 + signum);
}

static void forward(int signum)
{
    char msg[8];
    int n = 0;

    if (server < 0)
        die_of(signum); /* not connected yet: die as a tool without handlers */
    pending = signum;
    msg[n++] = 'S';
    if (signum >= 10)
        msg[n++] = (char)('0' + signum / 10);
    msg[n++] = (char)('0' + signum % 10);
    msg[n++] = '\n';
    if (write(server, msg, (size_t)n) < 0)
        die_of(signum);
}

static void ensure_open(int fd)
{
    if (fcntl(fd, F_GETFD) != -1)
        return;
    int null = open("/dev/null", O_RDWR);
    if (null >= 0 && null != fd) {
        dup2(null, fd);
        close(null);
    }
}

static int fail(const char *what, const char *where)
{
    fprintf(stderr, "scenario harness: fake tool: %s %s: %s\n", what, where,
            errno ? strerror(errno) : "no answer");
    return HARNESS_RC;
}

int main(int argc, char **argv)
{
    if (argc < 3 || strchr(argv[1], '|') == NULL) {
        fprintf(stderr, "usage: a fake tool's interpreter: #!%s <socket>|<world.json>\n", argv[0]);
        return HARNESS_RC;
    }
    char *config = strchr(argv[1], '|');
    *config++ = '\0';
    const char *path = argv[1];

    struct sigaction action;
    memset(&action, 0, sizeof(action));
    action.sa_handler = forward;
    sigemptyset(&action.sa_mask);
    sigaction(SIGTERM, &action, NULL);
    sigaction(SIGINT, &action, NULL);

    /* The call: pid, parent pid, world.json, then the script's argv, each ending in NUL. */
    char head[64];
    int head_len = snprintf(head, sizeof(head), "%ld%c%ld%c", (long)getpid(), 0,
                            (long)getppid(), 0);
    size_t size = (size_t)head_len + strlen(config) + 1;
    for (int i = 2; i < argc; i++)
        size += strlen(argv[i]) + 1;
    char *payload = malloc(sizeof(uint32_t) + size);
    if (payload == NULL)
        return fail("cannot build the call for", path);
    uint32_t length = (uint32_t)size;
    char *at = payload;
    memcpy(at, &length, sizeof(length));
    at += sizeof(length);
    memcpy(at, head, (size_t)head_len);
    at += head_len;
    for (int i = 1; i < argc; i++) {
        const char *item = i == 1 ? config : argv[i];
        size_t n = strlen(item) + 1;
        memcpy(at, item, n);
        at += n;
    }

    struct sockaddr_un address;
    memset(&address, 0, sizeof(address));
    address.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof(address.sun_path)) {
        errno = ENAMETOOLONG;
        return fail("cannot reach the fake-tool server at", path);
    }
    strcpy(address.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&address, sizeof(address)) < 0)
        return fail("cannot reach the fake-tool server at", path);

    ensure_open(1);
    ensure_open(2);
    int fds[2] = {1, 2};
    char control[CMSG_SPACE(sizeof(fds))];
    memset(control, 0, sizeof(control));
    struct iovec iov = {.iov_base = payload, .iov_len = sizeof(length) + size};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                         .msg_controllen = sizeof(control)};
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(fds));
    memcpy(CMSG_DATA(cmsg), fds, sizeof(fds));
    ssize_t sent;
    do
        sent = sendmsg(fd, &msg, MSG_NOSIGNAL);
    while (sent < 0 && errno == EINTR);
    if (sent < 0)
        return fail("cannot send the call to", path);
    for (size_t done = (size_t)sent; done < iov.iov_len;) {
        ssize_t n = send(fd, payload + done, iov.iov_len - done, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return fail("cannot send the call to", path);
        done += (size_t)n;
    }
    server = fd; /* from here a SIGTERM or SIGINT is forwarded */

    char reply[128];
    size_t got = 0;
    while (got < sizeof(reply) - 1 && memchr(reply, '\n', got) == NULL) {
        ssize_t n = read(fd, reply + got, sizeof(reply) - 1 - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (pending)
                die_of(pending);
            errno = n < 0 ? errno : 0;
            return fail("the fake-tool server ended the call without an answer:", path);
        }
        got += (size_t)n;
    }
    reply[got] = '\0';
    if (pending)
        die_of(pending); /* "K", or an answer that crossed the signal: die of it either way */
    int rc;
    double keep = 0;
    if (sscanf(reply, "E %d %lf", &rc, &keep) < 1) {
        errno = 0;
        return fail("the fake-tool server answered garbage:", reply);
    }
    if (keep > 0 && fork() == 0) {
        /* A tool whose helper outlives it: the child holds stdout and stderr open. */
        struct timespec left = {.tv_sec = (time_t)keep,
                                .tv_nsec = (long)((keep - (double)(time_t)keep) * 1e9)};
        close(fd);
        while (nanosleep(&left, &left) < 0 && errno == EINTR)
            ;
        _exit(0);
    }
    return rc;
}
