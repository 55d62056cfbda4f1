"""Facts: what a host is, read by one stdlib-only probe per host (one SSH round trip)."""
