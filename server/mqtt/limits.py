"""What one MQTT client may cost a broker: the same limits in the Mosquitto configuration the server
writes (``server.mqtt.mosquitto``) and in the embedded broker (``server.mqtt.broker``), so the broker
is the first line (as EMQX and HiveMQ enforce quotas before the application sees a byte) and the
bridge's checks (size, schema, signature) the second.

Sizes follow the protocol (``edge.contract.protocol``): the largest packet a device sends is a batch
or a verification call, ``MAX_BATCH_BYTES`` = ``MAX_REQUEST_BYTES`` = 256 KiB of payload plus its
topic and a few header bytes; ``MAX_PACKET_BYTES`` is twice that. The server's largest is a
verification reply (a vocabulary's probabilities, the target's states of a history: about 200 KB
for the base target); one over the limit is answered 413 by the bridge instead (verify over HTTP
has no such limit), since Mosquitto would close the bridge's connection for it. The limit bounds
what a device can park in a broker: a retained message on each of its six topics is at most 3 MiB
(the embedded broker keeps none), and a packet claiming more (a 200 MB CONNECT before any login, a
64 MB publish after one) is cut off at its fixed header. At 1 MiB, six retained maximal publishes
grew the embedded broker's process by 15-18 MB (Python keeps the copies' heap): too near 20.

Rates are per authenticated device, in the embedded broker only (Mosquitto 2.0 has no per-client
rate): packets and bytes a second, through token buckets. A device's agent batches what it has
queued (up to 256 messages a publish), so 200 packets a second is far above what one device needs
(the link bench's publishers, one message a publish, reach about 85 a second each) and 1 MiB a
second lets it drain four 256 KiB batches a second; a flood past them is slowed by not reading its
socket, never dropped. The bridge's session (``SERVER_USER``) is exempt.
"""

from __future__ import annotations

MAX_PACKET_BYTES = 1 << 19
"""The largest MQTT packet a broker accepts from anyone, before login too, counted as Mosquitto 2.0
counts it: a fixed header's first byte and its remaining length (not the 1-4 bytes of that length)."""
CONNECT_TIMEOUT_S = 10.0
"""A connection that has not sent a whole CONNECT by then is closed (embedded broker)."""
DEVICE_PACKETS_PER_S = 200.0
DEVICE_PACKET_BURST = 200.0
DEVICE_BYTES_PER_S = float(1 << 20)
DEVICE_BYTE_BURST = float(2 * MAX_PACKET_BYTES)
DEVICE_QOS2_IN_FLIGHT = 100
"""QoS 2 publishes of one device held by the embedded broker until their PUBREL; one more closes
the connection (a client that never releases them would otherwise park up to 65,535 packets)."""
DEVICE_QUEUED_MESSAGES = 1000
"""Messages the embedded broker holds for a device's session while the device is away (the server's
acks and commands); past it the oldest is dropped: an ack lost makes the device resend, the server
answers it again, and the bundle to run stays the retained ``ota`` command."""
OUTGOING_IN_FLIGHT = 1000
"""Mosquitto's QoS 1/2 messages in flight to one client (the bridge takes the fleet's stream)."""
QUEUED_MESSAGES = 1_000_000
QUEUED_BYTES = 64 << 20
"""Mosquitto's queue per client: the bridge's persistent session holds the fleet's backlog while
the server is away (about 200,000 messages of 300 bytes); past it Mosquitto drops, and the devices
resend, as they keep every message until the server's end-to-end ``ack``. Mosquitto 2.0 sets these
for every client alike; a device's own queue holds only what the server sends it."""
