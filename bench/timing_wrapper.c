/* bench/run.py's timing wrapper: put in front of a world's fake tool, it records the call's
 * start and end (wall clock) and exit status in the timing log, after sleeping the real-cost
 * scenario's time for the call when there is one.
 *
 * Built static (gcc -O2 -static), so that umockdev-run's LD_PRELOAD (every dynamic process in a
 * world loads it, and its start costs a millisecond or more) does not delay the first
 * timestamp: what a wrapper costs before its start and after its end is counted as the agent's
 * own time by the bench, as the shell wrapper's start (about 1.3 ms a call) was.
 *
 * Its configuration is <dir>/.real/<name>.cfg beside the fake it wraps (<dir>/.real/<name>):
 *   line 1: the timing log's path
 *   then:   <seconds> <pattern>   a real cost, first match wins: the pattern is the call's
 *           arguments joined by spaces, exact, or a prefix when it ends with '*'
 * The log line is "<start> <end> <rc> <name> <args...>", written in one append.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    double start = now();
    char self[4096], dir[4096], real[4096], cfg[4096], line[4096], log[4096] = "";
    snprintf(self, sizeof self, "%s", argv[0]);
    char *name = basename(self);
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", argv[0]);
    snprintf(dir, sizeof dir, "%s", dirname(copy));
    snprintf(real, sizeof real, "%s/.real/%s", dir, name);
    snprintf(cfg, sizeof cfg, "%s/.real/%s.cfg", dir, name);

    char args[8192] = "";
    size_t used = 0;
    for (int i = 1; i < argc && used < sizeof args - 1; i++)
        used += snprintf(args + used, sizeof args - used, i > 1 ? " %s" : "%s", argv[i]);

    double cost = 0;
    FILE *f = fopen(cfg, "r");
    if (f == NULL) {
        fprintf(stderr, "timing wrapper: %s: %s\n", cfg, strerror(errno));
        return 126;
    }
    int found = 0;
    for (int n = 0; fgets(line, sizeof line, f); n++) {
        line[strcspn(line, "\n")] = 0;
        if (n == 0) {
            snprintf(log, sizeof log, "%s", line);
            continue;
        }
        char *pattern = strchr(line, ' ');
        if (found || pattern == NULL)
            continue;
        *pattern++ = 0;
        size_t len = strlen(pattern);
        int match = len && pattern[len - 1] == '*' ? strncmp(args, pattern, len - 1) == 0
                                                  : strcmp(args, pattern) == 0;
        if (match) {
            cost = atof(line);
            found = 1;
        }
    }
    fclose(f);
    if (cost > 0) {
        struct timespec ts = {(time_t)cost, (long)((cost - (time_t)cost) * 1e9)};
        while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
        }
    }

    int rc = 127;
    pid_t pid = fork();
    if (pid == 0) {
        argv[0] = real;
        execv(real, argv);
        _exit(127);
    }
    if (pid > 0) {
        int status;
        while (waitpid(pid, &status, 0) == -1 && errno == EINTR) {
        }
        rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    double end = now();
    char out[16384];
    int n = snprintf(out, sizeof out, "%.6f %.6f %d %s %s\n", start, end, rc, name, args);
    int fd = open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) {
        if (write(fd, out, n < (int)sizeof out ? n : (int)sizeof out - 1) < 0) {
        }
        close(fd);
    }
    return rc;
}
