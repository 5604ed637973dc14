/*
 * control.h - the control socket and the "cuip-ctl" and "cuip-op" threads
 * (control.c). Started by lifecycle.c; the control thread takes only
 * xc_lock, never cuip_state_lock, and never calls the driver.
 */
#ifndef CUIP_CONTROL_H
#define CUIP_CONTROL_H

int cuip_ctl_start(void);
void cuip_ctl_stop(void); /* exit: unlink the socket */

#endif /* CUIP_CONTROL_H */
