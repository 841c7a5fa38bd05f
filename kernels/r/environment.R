# R's version and every installed package with its version, as JSON on stdout
# (kernels/environment.py runs it with `Rscript --vanilla`). Base R only.
quote <- function(s) paste0('"', gsub('(["\\\\])', '\\\\\\1', s), '"')
installed <- installed.packages(fields = character(0))[, c("Package", "Version"), drop = FALSE]
installed <- installed[!duplicated(installed[, "Package"]), , drop = FALSE]
packages <- sprintf('{"name": %s, "version": %s}',
                    quote(installed[, "Package"]), quote(installed[, "Version"]))
version <- paste(R.version$major, R.version$minor, sep = ".")
cat(sprintf('{"version": %s, "packages": [%s]}\n', quote(version),
            paste(packages, collapse = ", ")))
