"""Images: registry client, content store, layer unpack, overlay snapshots."""
