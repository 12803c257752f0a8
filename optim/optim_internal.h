/* Private to optim/: helpers optim.c and schedule.c share. */
#ifndef QT_OPTIM_INTERNAL_H
#define QT_OPTIM_INTERNAL_H

/* The index of `name` in names[0..n), -1 when absent (or name is NULL). */
int qt_optim_name_index(const char *const *names, int n, const char *name);

#endif
