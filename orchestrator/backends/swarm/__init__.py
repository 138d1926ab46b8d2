"""Docker Swarm (internal): sandboxes as one-replica services over a Swarm's nodes, reached through a relay on each.

The relay itself runs in the sandbox image (``agent/node_relay.py``); here are the controller's side of it
(``relay_client``), its deployment (``relay_service``), its credentials (``tls``) and the choice of a node (``nodes``).
"""
