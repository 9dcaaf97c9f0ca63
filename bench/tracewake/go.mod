module gpushare.local/bench/tracewake

go 1.26.0

require golang.org/x/exp v0.0.0-20261121134650-e1094eeca1b5
