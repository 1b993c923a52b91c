#!/bin/sh
# Start RabbitMQ in the foreground as the rabbitmq user, with a configuration written from the environment.
set -eu
conf=/var/lib/rabbitmq/megha.conf
umask 077
cat > "$conf" <<CONF
listeners.tcp.default = 5672
loopback_users = none
default_user = ${RABBITMQ_DEFAULT_USER}
default_pass = ${RABBITMQ_DEFAULT_PASS}
log.console = true
log.console.level = info
log.console.use_colors = off
log.file = false
CONF
export RABBITMQ_CONFIG_FILE="$conf"
exec /usr/lib/rabbitmq/bin/rabbitmq-server "$@"
