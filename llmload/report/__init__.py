"""What a run's records become: the summary, computed once (`summary`), its warnings (`warnings`),
goodput against the SLOs (`goodput`), the figures of each model of a mix (`groups`), report.md
(`markdown`) and report.html (`html`) with the notes both print (`notes`), the capacity search's page
(`search_page`), the sweep's pages (`sweep_page`) and the Pareto frontier both draw (`pareto`) and its
chart (`pareto_chart`)."""
