"""Running a step: `simulate` (`simulator`), the two-process split (`split`, `split_worker`,
`worker_process`), loading a strategy file (`file_import`), and recording and replaying a program
(`recording`, `replay`)."""
