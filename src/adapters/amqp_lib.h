/* amqp_lib.h - librabbitmq's API, under the names of the installed version.
 *
 * librabbitmq 0.12 moved its headers to rabbitmq-c/ and made the old names
 * a #warning, which -Werror turns into a failed build. Debian 12 ships
 * 0.11 (old names only), Debian 13 ships 0.15: every file that speaks AMQP
 * includes this one instead, so both build warning-free. */
#ifndef SK_AMQP_LIB_H
#define SK_AMQP_LIB_H

#if __has_include(<rabbitmq-c/amqp.h>)
#include <rabbitmq-c/amqp.h>
#include <rabbitmq-c/framing.h>
#include <rabbitmq-c/ssl_socket.h>
#include <rabbitmq-c/tcp_socket.h>
#else
#include <amqp.h>
#include <amqp_framing.h>
#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>
#endif

#endif
