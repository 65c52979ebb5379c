"""Drills on this machine: the demo, the lab outage drills, the fault drills and the drain drill, and what they share."""
