"""MQTT: the bridge that checks and stores device messages, the embedded broker, and
Mosquitto's generated password file and ACL."""
