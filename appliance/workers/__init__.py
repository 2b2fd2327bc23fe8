"""Supervised preprocessing worker processes and the shared-memory slot arena they write into."""
