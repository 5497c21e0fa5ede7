/* ctl_commands.h - sekalictl's commands, one file each, dispatched by ctl.c's
 * table. Each takes the loaded configuration and its own arguments
 * (argv[0] is the command's name; getopt is reset) and returns an exit code
 * of ctl_common.h. */
#ifndef SK_CTL_COMMANDS_H
#define SK_CTL_COMMANDS_H

#include "config.h"

int sk_ctl_migrate(const struct sk_conf *conf, int argc, char **argv);   /* ctl_migrate.c */
int sk_ctl_enqueue(const struct sk_conf *conf, int argc, char **argv);   /* ctl_enqueue.c */
int sk_ctl_dlq(const struct sk_conf *conf, int argc, char **argv);       /* ctl_dlq.c */
int sk_ctl_status(const struct sk_conf *conf, int argc, char **argv);    /* ctl_status.c */
int sk_ctl_trace(const struct sk_conf *conf, int argc, char **argv);     /* ctl_trace.c */
int sk_ctl_doctor(const struct sk_conf *conf, int argc, char **argv);    /* ctl_doctor.c */
int sk_ctl_verify(const struct sk_conf *conf, int argc, char **argv);    /* ctl_verify.c */
int sk_ctl_schedules(const struct sk_conf *conf, int argc, char **argv); /* ctl_schedules.c */
int sk_ctl_pause(const struct sk_conf *conf, int argc, char **argv);     /* ctl_pause.c */
int sk_ctl_resume(const struct sk_conf *conf, int argc, char **argv);    /* ctl_pause.c */

/* ctl.c: the usage of command on stderr, for a command's usage error. */
void sk_ctl_usage_of(const char *command);

#endif
