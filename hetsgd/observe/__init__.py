"""What a run observes: utilization while it trains, a progress display, snapshot evaluation."""
