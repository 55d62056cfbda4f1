"""Stand-ins for tools the lab containers lack (no GPU on this machine): scripts installed there."""
