/* ctl_commands.h - sekalictl's commands, one file each, dispatched by ctl.c's
 * table. Each takes the loaded configuration and its own arguments
 * (argv[0] is the command's name; getopt is reset) and returns an exit code
 * of ctl_common.h, or SK_CTL_SHOW_USAGE. */
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
int sk_ctl_serve(const struct sk_conf *conf, int argc, char **argv);     /* console.c */
int sk_ctl_schedules(const struct sk_conf *conf, int argc, char **argv); /* ctl_schedules.c */
int sk_ctl_scheduled(const struct sk_conf *conf, int argc, char **argv); /* ctl_scheduled.c */
int sk_ctl_inflight(const struct sk_conf *conf, int argc, char **argv);  /* ctl_inflight.c */
int sk_ctl_pause(const struct sk_conf *conf, int argc, char **argv);     /* ctl_pause.c */
int sk_ctl_resume(const struct sk_conf *conf, int argc, char **argv);    /* ctl_pause.c */
int sk_ctl_cancel(const struct sk_conf *conf, int argc, char **argv);    /* ctl_cancel.c */

/* Returned by a command for a usage error: ctl.c prints the command's
 * usage on stderr and exits with SK_CTL_USAGE. A command returns it rather
 * than printing the usage itself, so that the commands never call back
 * into their dispatcher. Never an exit code itself. */
#define SK_CTL_SHOW_USAGE (-2)

#endif
