"""What decides and keeps compiled programs: shape buckets, kept traces, which
traces a block of code ran."""
