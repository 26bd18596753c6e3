# Shared by the integration scripts: source it.

# A TCP port free a moment ago, below the ephemeral range (32768-60999), where no
# connection's source port can take it.
free_port() {
  /usr/bin/python3 -c '
import random, socket
for _ in range(200):
    port = random.randrange(20000, 32000)
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            continue
    print(port)
    break'
}
