"""Running a job's processes: the supervisor (torch's elastic agent), one worker process, and the
summary of a sweep's jobs."""
