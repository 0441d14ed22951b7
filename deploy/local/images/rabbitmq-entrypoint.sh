#!/bin/bash
# The stand-in rabbitmq image's entrypoint (deploy/local/images/rabbitmq.Containerfile):
# RABBITMQ_DEFAULT_USER / RABBITMQ_DEFAULT_PASS become the default user of the
# first start (RabbitMQ creates it only when its database is new), as in the
# official image; then the server.
set -Eeuo pipefail
if [ -n "${RABBITMQ_DEFAULT_USER:-}" ] || [ -n "${RABBITMQ_DEFAULT_PASS:-}" ]; then
    umask 077
    {
        [ -z "${RABBITMQ_DEFAULT_USER:-}" ] || printf 'default_user = %s\n' "$RABBITMQ_DEFAULT_USER"
        [ -z "${RABBITMQ_DEFAULT_PASS:-}" ] || printf 'default_pass = %s\n' "$RABBITMQ_DEFAULT_PASS"
    } >/etc/rabbitmq/conf.d/05-default-user.conf
fi
exec "$@"
