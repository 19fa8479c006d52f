"""Clients of the services the collector calls over the network."""
